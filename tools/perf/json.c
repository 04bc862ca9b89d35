/* Recursive-descent JSON reader for chorus-plot (see json.h). Depth is bounded; \u escapes outside
 * ASCII are kept as '?', which is enough for labels. */
#include "json.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct parser {
  const char* s;
  const char* start;
  char* err;
  size_t errlen;
  int depth;
};

static int fail(struct parser* p, const char* what) {
  if (p->err && !p->err[0]) snprintf(p->err, p->errlen, "%s at offset %ld", what, (long)(p->s - p->start));
  return -1;
}

static void skip_ws(struct parser* p) {
  while (*p->s == ' ' || *p->s == '\t' || *p->s == '\n' || *p->s == '\r') p->s++;
}

static int parse_value(struct parser* p, js* out);

static int parse_string(struct parser* p, char** out) {
  p->s++; /* opening quote */
  size_t cap = 16, n = 0;
  char* buf = malloc(cap);
  if (!buf) return fail(p, "out of memory");
  for (;;) {
    char c = *p->s++;
    if (c == '\0') return free(buf), fail(p, "unterminated string");
    if (c == '"') break;
    if (c == '\\') {
      char e = *p->s++;
      switch (e) {
        case 'n': c = '\n'; break;
        case 't': c = '\t'; break;
        case 'r': c = '\r'; break;
        case 'b': c = '\b'; break;
        case 'f': c = '\f'; break;
        case 'u': {
          unsigned v = 0;
          for (int i = 0; i < 4; i++) {
            char h = *p->s++;
            v <<= 4;
            if (h >= '0' && h <= '9') v |= (unsigned)(h - '0');
            else if (h >= 'a' && h <= 'f') v |= (unsigned)(h - 'a' + 10);
            else if (h >= 'A' && h <= 'F') v |= (unsigned)(h - 'A' + 10);
            else return free(buf), fail(p, "bad \\u escape");
          }
          c = v < 0x80 ? (char)v : '?';
          break;
        }
        case '\0': return free(buf), fail(p, "unterminated string");
        default: c = e; break; /* \" \\ \/ */
      }
    }
    if (n + 2 > cap) {
      char* nb = realloc(buf, cap *= 2);
      if (!nb) return free(buf), fail(p, "out of memory");
      buf = nb;
    }
    buf[n++] = c;
  }
  buf[n] = '\0';
  *out = buf;
  return 0;
}

static int add_item(struct parser* p, js* v, int* cap) {
  if (v->n == *cap) {
    *cap = *cap ? *cap * 2 : 8;
    js* ni = realloc(v->items, sizeof(js) * (size_t)*cap);
    if (!ni) return fail(p, "out of memory");
    v->items = ni;
    if (v->type == JS_OBJ) {
      char** nk = realloc(v->keys, sizeof(char*) * (size_t)*cap);
      if (!nk) return fail(p, "out of memory");
      v->keys = nk;
    }
  }
  memset(&v->items[v->n], 0, sizeof(js));
  return 0;
}

static int parse_container(struct parser* p, js* v, char close) {
  int cap = 0;
  p->s++;
  if (++p->depth > 64) return fail(p, "nested too deeply");
  skip_ws(p);
  if (*p->s == close) {
    p->s++;
    p->depth--;
    return 0;
  }
  for (;;) {
    skip_ws(p);
    if (add_item(p, v, &cap)) return -1;
    if (close == '}') {
      if (*p->s != '"') return fail(p, "expected a key");
      if (parse_string(p, &v->keys[v->n])) return -1;
      skip_ws(p);
      if (*p->s++ != ':') return free(v->keys[v->n]), fail(p, "expected ':'");
    }
    if (parse_value(p, &v->items[v->n])) {
      if (close == '}') free(v->keys[v->n]);
      return -1;
    }
    v->n++;
    skip_ws(p);
    if (*p->s == ',') {
      p->s++;
      continue;
    }
    if (*p->s == close) {
      p->s++;
      p->depth--;
      return 0;
    }
    return fail(p, close == '}' ? "expected ',' or '}'" : "expected ',' or ']'");
  }
}

static int parse_value(struct parser* p, js* out) {
  memset(out, 0, sizeof(*out));
  skip_ws(p);
  char c = *p->s;
  if (c == '{') return out->type = JS_OBJ, parse_container(p, out, '}');
  if (c == '[') return out->type = JS_ARR, parse_container(p, out, ']');
  if (c == '"') return out->type = JS_STR, parse_string(p, &out->str);
  if (strncmp(p->s, "true", 4) == 0) return p->s += 4, out->type = JS_BOOL, out->num = 1, 0;
  if (strncmp(p->s, "false", 5) == 0) return p->s += 5, out->type = JS_BOOL, 0;
  if (strncmp(p->s, "null", 4) == 0) return p->s += 4, out->type = JS_NULL, 0;
  if (c == '-' || (c >= '0' && c <= '9')) {
    char* end;
    out->num = strtod(p->s, &end);
    if (end == p->s) return fail(p, "bad number");
    p->s = end;
    out->type = JS_NUM;
    return 0;
  }
  return fail(p, c ? "unexpected character" : "unexpected end of input");
}

js* js_parse(const char* text, char* err, size_t errlen) {
  struct parser p = {text, text, err, errlen, 0};
  if (err && errlen) err[0] = '\0';
  js* v = calloc(1, sizeof(js));
  if (!v) return NULL;
  if (parse_value(&p, v) == 0) {
    skip_ws(&p);
    if (*p.s == '\0') return v;
    fail(&p, "trailing characters");
  }
  js_free(v);
  return NULL;
}

static void free_inner(js* v) {
  for (int i = 0; i < v->n; i++) {
    free_inner(&v->items[i]);
    if (v->keys) free(v->keys[i]);
  }
  free(v->items);
  free(v->keys);
  free(v->str);
}

void js_free(js* v) {
  if (!v) return;
  free_inner(v);
  free(v);
}

const js* js_get(const js* obj, const char* key) {
  if (!obj || obj->type != JS_OBJ) return NULL;
  for (int i = 0; i < obj->n; i++)
    if (strcmp(obj->keys[i], key) == 0) return &obj->items[i];
  return NULL;
}

double js_number(const js* v, double dflt) {
  if (!v) return dflt;
  if (v->type == JS_NUM || v->type == JS_BOOL) return v->num;
  if (v->type == JS_STR) {
    char* end;
    double d = strtod(v->str, &end);
    return end == v->str ? dflt : d;
  }
  return dflt;
}

const char* js_string(const js* v, const char* dflt) { return v && v->type == JS_STR ? v->str : dflt; }

/* A small JSON reader (whole document in memory), enough for chorus-plot to read -J files. */
#ifndef CHORUS_JSON_H
#define CHORUS_JSON_H

#include <stddef.h>

typedef enum { JS_NULL, JS_BOOL, JS_NUM, JS_STR, JS_ARR, JS_OBJ } js_type;

typedef struct js {
  js_type type;
  double num;       /* JS_NUM, JS_BOOL (0/1) */
  char* str;        /* JS_STR */
  int n;            /* items of JS_ARR / JS_OBJ */
  struct js* items;
  char** keys;      /* JS_OBJ */
} js;

/* Parse text; NULL on error with a message (including the offset) in err. */
js* js_parse(const char* text, char* err, size_t errlen);
void js_free(js* v);
const js* js_get(const js* obj, const char* key); /* NULL if absent or obj is not an object */
/* A number, or a string holding one (nccl-tests writes "nan" and pads roots as strings). */
double js_number(const js* v, double dflt);
const char* js_string(const js* v, const char* dflt);

#endif

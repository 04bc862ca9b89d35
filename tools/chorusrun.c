/* chorusrun: start N local ranks of a Chorus program.
 *
 *   chorusrun -n N [--bind none|core|numa] [--tag-output] [--timeout S] prog [args...]
 *   chorusrun --hosts a,b[,...] [--per-host K] [--port P] prog [args...]   (prints per-host commands)
 *
 * Each rank gets NCCL_COMM_ID=127.0.0.1:<free port> (rank 0 hosts the bootstrap root there), RANK,
 * WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE; chorusInitFromEnv() reads them. A local job also gets
 * CHORUS_SECRET, 256 random bits drawn per job, so that no other process can join it (only the
 * same uid can read a process's environment); an inherited CHORUS_SECRET / CHORUS_SECRET_FILE is
 * kept (several hosts must share one: docs/SECURITY.md). Every rank runs in its
 * own process group so that signals reach whatever it started. The first rank to fail (non-zero exit
 * or a signal) is reported, the others get SIGTERM and, 2 s later, SIGKILL, and chorusrun exits with
 * the failed rank's status (128+signal for a signal). --timeout ends a run that takes too long with
 * exit code 124, naming the ranks still running. SIGINT, SIGTERM, SIGHUP and SIGQUIT are forwarded to every rank. */
#define _GNU_SOURCE
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define GRACE_NS 2000000000ull /* SIGTERM to SIGKILL */
#define DRAIN_NS 500000000ull  /* --tag-output: how long to wait for pipes after the last rank exited */
/* A rank that exits cleanly while others still run this long after it is reported: at the end of a
 * normal job the ranks leave within milliseconds of each other, so this says nothing there. */
#define EARLY_EXIT_NS 1000000000ull

enum { BIND_NONE, BIND_CORE, BIND_NUMA };

struct linebuf {
  int fd;      /* read end, -1 once closed */
  int out;     /* 1 or 2 */
  char* buf;
  size_t len, cap;
};

struct rank {
  pid_t pid;
  int rank, running, status;
  uint64_t exited_at; /* exited with status 0 at (ns), until said or the job is over */
  struct linebuf lb[2];
};

static struct {
  int n, bind, tag, per_host, first, world, port, respawn;
  double timeout;
  char* hosts;
  char** argv;
} opt = {.n = -1, .first = -1, .world = -1};

static int sigpipe_fds[2] = {-1, -1};

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static const char* sig_name(int sig, char* buf, size_t n) {
  static const struct { int s; const char* name; } names[] = {
      {SIGHUP, "SIGHUP"},   {SIGINT, "SIGINT"},   {SIGQUIT, "SIGQUIT"}, {SIGILL, "SIGILL"},   {SIGTRAP, "SIGTRAP"},
      {SIGABRT, "SIGABRT"}, {SIGBUS, "SIGBUS"},   {SIGFPE, "SIGFPE"},   {SIGKILL, "SIGKILL"}, {SIGUSR1, "SIGUSR1"},
      {SIGSEGV, "SIGSEGV"}, {SIGUSR2, "SIGUSR2"}, {SIGPIPE, "SIGPIPE"}, {SIGALRM, "SIGALRM"}, {SIGTERM, "SIGTERM"},
      {SIGXCPU, "SIGXCPU"}, {SIGXFSZ, "SIGXFSZ"}, {SIGSYS, "SIGSYS"}};
  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
    if (names[i].s == sig) return names[i].name;
  snprintf(buf, n, "signal %d", sig);
  return buf;
}

static int usage_error(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
static int usage_error(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "chorusrun: ");
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, "\nusage: chorusrun -n N [--bind none|core|numa] [--tag-output] [--timeout S] prog [args...]\n"
                  "       chorusrun --hosts HOST1,HOST2,... [--per-host K] [--port P] prog [args...]\n"
                  "Run 'chorusrun --help' for details.\n");
  return 2;
}

static void usage(void) {
  printf("usage: chorusrun -n N [options] prog [args...]\n"
         "Start N ranks of prog on this machine. Each rank gets NCCL_COMM_ID=127.0.0.1:<free port>, RANK,\n"
         "WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE (read by chorusInitFromEnv), and a random per-job\n"
         "CHORUS_SECRET unless CHORUS_SECRET or CHORUS_SECRET_FILE is set already (see docs/SECURITY.md).\n"
         "  -n, --np N            number of ranks to start\n"
         "  --bind none|core|numa pin rank i to core i (mod cores) or to NUMA node i (mod nodes)\n"
         "  --tag-output          prefix each line the ranks print with [rank]\n"
         "  --timeout S           stop all ranks after S seconds (exit code 124)\n"
         "  --hosts a,b,...       print the command to run on each host instead of starting anything\n"
         "  --per-host K          ranks per host with --hosts (default 1)\n"
         "  --port P              rendezvous port (default: a free port on this machine)\n"
         "  --first-rank R        with --world-size: the ranks started here are R..R+N-1 of a larger job\n"
         "  --world-size W        (used in the commands --hosts prints; takes NCCL_COMM_ID from the environment)\n"
         "  --respawn K           start a replacement for a rank that fails, K times in all, instead of ending the\n"
         "                        job: it gets the same RANK and CHORUS_RESPAWN=k (the k-th replacement; 0 for the\n"
         "                        first ranks), and every rank gets CHORUS_ELASTIC_DIR, a private folder removed at\n"
         "                        the end, to hand it the grow id (ncclCommGrow; examples/elastic.c)\n"
         "When a rank fails, the others get SIGTERM, then SIGKILL 2 s later, and chorusrun exits with the\n"
         "failed rank's status (128+signal if it was killed). SIGINT, SIGTERM, SIGHUP and SIGQUIT are passed on to the ranks.\n");
}

static int parse_num(const char* s, long lo, long hi, long* out) {
  char* end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (end == s || *end || errno || v < lo || v > hi) return -1;
  *out = v;
  return 0;
}

static int parse_args(int argc, char** argv) {
  static const struct option lo[] = {
      {"np", required_argument, 0, 'n'},         {"bind", required_argument, 0, 'b'},
      {"tag-output", no_argument, 0, 't'},       {"timeout", required_argument, 0, 'T'},
      {"hosts", required_argument, 0, 'H'},      {"per-host", required_argument, 0, 'k'},
      {"first-rank", required_argument, 0, 'f'}, {"world-size", required_argument, 0, 'w'},
      {"port", required_argument, 0, 'p'},       {"help", no_argument, 0, 'h'},
      {"respawn", required_argument, 0, 'r'},
      {0, 0, 0, 0}};
  opterr = 0;
  int c;
  long v;
  while ((c = getopt_long(argc, argv, "+:n:h", lo, NULL)) != -1) {
    switch (c) {
      case 'n':
        if (parse_num(optarg, 1, 1 << 20, &v))
          return usage_error("-n needs a positive number of ranks, got '%s'", optarg);
        opt.n = (int)v;
        break;
      case 'b':
        if (strcmp(optarg, "none") == 0) opt.bind = BIND_NONE;
        else if (strcmp(optarg, "core") == 0) opt.bind = BIND_CORE;
        else if (strcmp(optarg, "numa") == 0) opt.bind = BIND_NUMA;
        else return usage_error("--bind takes none, core or numa, got '%s'", optarg);
        break;
      case 't': opt.tag = 1; break;
      case 'T': {
        char* end;
        opt.timeout = strtod(optarg, &end);
        if (end == optarg || *end || !(opt.timeout > 0) || opt.timeout > 1e9)
          return usage_error("--timeout needs a positive number of seconds, got '%s'", optarg);
        break;
      }
      case 'H': opt.hosts = optarg; break;
      case 'k':
        if (parse_num(optarg, 1, 1 << 20, &v))
          return usage_error("--per-host needs a positive number, got '%s'", optarg);
        opt.per_host = (int)v;
        break;
      case 'f':
        if (parse_num(optarg, 0, INT_MAX, &v)) return usage_error("--first-rank needs a rank, got '%s'", optarg);
        opt.first = (int)v;
        break;
      case 'w':
        if (parse_num(optarg, 1, INT_MAX, &v))
          return usage_error("--world-size needs a positive number, got '%s'", optarg);
        opt.world = (int)v;
        break;
      case 'p':
        if (parse_num(optarg, 1, 65535, &v))
          return usage_error("--port needs a port number (1-65535), got '%s'", optarg);
        opt.port = (int)v;
        break;
      case 'r':
        if (parse_num(optarg, 0, 1 << 20, &v)) return usage_error("--respawn needs a number of replacements, got '%s'", optarg);
        opt.respawn = (int)v;
        break;
      case 'h': usage(); exit(0);
      case ':': return usage_error("option '%s' needs a value", argv[optind - 1]);
      default: return usage_error("unknown option '%s'", argv[optind - 1]);
    }
  }
  if (optind >= argc) return usage_error("no program to run");
  opt.argv = argv + optind;
  if (opt.hosts) {
    if (!opt.per_host) opt.per_host = 1;
    if (opt.first >= 0 || opt.world >= 0)
      return usage_error("--hosts cannot be combined with --first-rank/--world-size");
    return 0;
  }
  if (opt.per_host) return usage_error("--per-host only makes sense with --hosts");
  if (opt.n < 0) return usage_error("the number of ranks (-n N) is required");
  if ((opt.first >= 0) != (opt.world >= 0)) return usage_error("--first-rank and --world-size go together");
  if (opt.first < 0) opt.first = 0, opt.world = opt.n;
  else if ((long long)opt.first + opt.n > opt.world) /* in long long: --first-rank may be INT_MAX */
    return usage_error("ranks %d..%lld do not fit in a world of %d", opt.first, (long long)opt.first + opt.n - 1,
                       opt.world);
  return 0;
}

/* A port nobody listens on right now: bind port 0, read it back, close. Rank 0 binds it next. */
static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK), .sin_port = 0};
  socklen_t len = sizeof a;
  int port = -1;
  if (bind(fd, (struct sockaddr*)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr*)&a, &len) == 0)
    port = ntohs(a.sin_port);
  close(fd);
  return port;
}

/* ---------------------------------------------------------------- --hosts: print commands ---- */

static void print_quoted(const char* s) {
  if (*s && strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./=:,+@%") == strlen(s)) {
    fputs(s, stdout);
    return;
  }
  putchar('\'');
  for (; *s; s++) {
    if (*s == '\'') fputs("'\\''", stdout);
    else putchar(*s);
  }
  putchar('\'');
}

static int print_hosts(void) {
  char* list = strdup(opt.hosts);
  char* hosts[1024];
  int nh = 0;
  for (char* save = NULL, *h = strtok_r(list, ",", &save); h; h = strtok_r(NULL, ",", &save)) {
    if (nh == 1024) return free(list), usage_error("too many hosts (1024 at most)");
    hosts[nh++] = h;
  }
  if (nh == 0) return free(list), usage_error("--hosts needs at least one host name");
  int world = nh * opt.per_host;
  if (opt.n >= 0 && opt.n != world)
    return free(list), usage_error("-n %d does not match --hosts (%d hosts) x --per-host %d = %d", opt.n, nh,
                                   opt.per_host, world);
  int port = opt.port ? opt.port : free_port();
  if (port < 0) {
    fprintf(stderr, "chorusrun: cannot find a free port: %s\n", strerror(errno));
    free(list);
    return 1;
  }
  char self[PATH_MAX], cwd[PATH_MAX];
  ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
  if (sl <= 0) snprintf(self, sizeof self, "chorusrun");
  else self[sl] = '\0';
  if (!getcwd(cwd, sizeof cwd)) snprintf(cwd, sizeof cwd, ".");
  printf("# %d hosts x %d ranks = %d ranks. Rank 0 (on %s) hosts the rendezvous at %s:%d%s.\n", nh, opt.per_host, world,
         hosts[0], hosts[0], port, opt.port ? "" : " (port checked free on this machine only; choose one with --port)");
  printf("# Run each line on its host, for example with ssh HOST '<line>'.\n");
  printf("# Protect the job: put one random secret in a file of mode 0600 on every host (e.g. head -c 32\n"
         "# /dev/urandom | od -An -tx1 | tr -d ' \\n' > ~/.chorus-secret) and set CHORUS_SECRET_FILE to it.\n");
  for (int h = 0; h < nh; h++) {
    int r0 = h * opt.per_host;
    printf("# on %s: ranks %d-%d\n", hosts[h], r0, r0 + opt.per_host - 1);
    printf("cd ");
    print_quoted(cwd);
    printf(" && NCCL_COMM_ID=%s:%d ", hosts[0], port);
    print_quoted(self);
    printf(" -n %d --first-rank %d --world-size %d", opt.per_host, r0, world);
    if (opt.bind) printf(" --bind %s", opt.bind == BIND_CORE ? "core" : "numa");
    if (opt.tag) printf(" --tag-output");
    if (opt.timeout > 0) printf(" --timeout %.15g", opt.timeout); /* %g printed 1234567 as 1.23457e+06 */
    for (char** a = opt.argv; *a; a++) {
      putchar(' ');
      print_quoted(*a);
    }
    putchar('\n');
  }
  free(list);
  return 0;
}

/* ---------------------------------------------------------------- binding ---- */

static int parse_cpulist(const char* s, cpu_set_t* set) {
  CPU_ZERO(set);
  int count = 0;
  while (*s && *s != '\n') {
    char* end;
    long a = strtol(s, &end, 10), b = a;
    if (end == s) return -1;
    if (*end == '-') b = strtol(end + 1, &end, 10);
    for (long c = a; c <= b && c < CPU_SETSIZE; c++) CPU_SET((int)c, set), count++;
    s = *end == ',' ? end + 1 : end;
  }
  return count;
}

/* Called in the child: pin local rank i. Failure is reported and ignored. */
static void bind_rank(int i) {
  cpu_set_t set;
  if (opt.bind == BIND_CORE) {
    cpu_set_t allowed;
    if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return;
    int n = CPU_COUNT(&allowed), k = i % (n ? n : 1), c;
    for (c = 0; c < CPU_SETSIZE; c++)
      if (CPU_ISSET(c, &allowed) && k-- == 0) break;
    CPU_ZERO(&set);
    CPU_SET(c, &set);
  } else {
    int nodes[1024], nn = 0;
    DIR* d = opendir("/sys/devices/system/node");
    for (struct dirent* e; d && (e = readdir(d)) && nn < 1024;)
      if (strncmp(e->d_name, "node", 4) == 0 && isdigit((unsigned char)e->d_name[4])) nodes[nn++] = atoi(e->d_name + 4);
    if (d) closedir(d);
    if (nn == 0) {
      fprintf(stderr, "chorusrun: no NUMA nodes in /sys/devices/system/node; rank not bound\n");
      return;
    }
    for (int a = 0; a < nn; a++) /* node numbers in order */
      for (int b = a + 1; b < nn; b++)
        if (nodes[b] < nodes[a]) { int t = nodes[a]; nodes[a] = nodes[b]; nodes[b] = t; }
    /* Only nodes with CPUs this process may use (memory-only nodes have none; taskset narrows them) */
    cpu_set_t allowed, sets[64];
    int ns = 0;
    if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) CPU_ZERO(&allowed);
    for (int k = 0; k < nn && ns < 64; k++) {
      char path[96], line[4096];
      snprintf(path, sizeof path, "/sys/devices/system/node/node%d/cpulist", nodes[k]);
      FILE* f = fopen(path, "r");
      int ok = f && fgets(line, sizeof line, f) && parse_cpulist(line, &sets[ns]) > 0;
      if (f) fclose(f);
      if (!ok) continue;
      CPU_AND(&sets[ns], &sets[ns], &allowed);
      if (CPU_COUNT(&sets[ns]) > 0) ns++;
    }
    if (ns == 0) {
      fprintf(stderr, "chorusrun: no NUMA node has CPUs this process may use; rank not bound\n");
      return;
    }
    set = sets[i % ns];
  }
  if (sched_setaffinity(0, sizeof set, &set) != 0)
    fprintf(stderr, "chorusrun: binding local rank %d failed: %s\n", i, strerror(errno));
}

/* ---------------------------------------------------------------- running the ranks ---- */

static void on_signal(int sig) {
  int e = errno;
  unsigned char b = (unsigned char)sig;
  if (write(sigpipe_fds[1], &b, 1) < 0) { /* pipe full: a wakeup is already pending */
  }
  errno = e;
}

static void write_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    p += w, n -= (size_t)w;
  }
}

/* Print complete lines with the rank prefix; at EOF (final) also the unterminated rest. */
static void emit_lines(struct rank* r, struct linebuf* lb, int final) {
  char prefix[32];
  int pl = snprintf(prefix, sizeof prefix, "[%d] ", r->rank);
  size_t start = 0;
  for (size_t i = 0; i < lb->len; i++) {
    if (lb->buf[i] != '\n') continue;
    char* out = malloc((size_t)pl + i - start + 1);
    if (!out) break;
    memcpy(out, prefix, (size_t)pl);
    memcpy(out + pl, lb->buf + start, i - start + 1);
    write_all(lb->out, out, (size_t)pl + i - start + 1); /* one write per line keeps lines whole */
    free(out);
    start = i + 1;
  }
  if ((final || lb->len - start >= 65536) && lb->len > start) { /* flush a very long or unterminated line */
    write_all(lb->out, prefix, (size_t)pl);
    write_all(lb->out, lb->buf + start, lb->len - start);
    write_all(lb->out, "\n", 1);
    start = lb->len;
  }
  memmove(lb->buf, lb->buf + start, lb->len - start);
  lb->len -= start;
}

static void read_pipe(struct rank* r, struct linebuf* lb) {
  if (lb->cap - lb->len < 4096) {
    size_t nc = lb->cap ? lb->cap * 2 : 8192;
    char* nb = realloc(lb->buf, nc);
    if (!nb) return;
    lb->buf = nb, lb->cap = nc;
  }
  ssize_t got = read(lb->fd, lb->buf + lb->len, lb->cap - lb->len);
  if (got < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (got <= 0) {
    emit_lines(r, lb, 1);
    close(lb->fd);
    lb->fd = -1;
    return;
  }
  lb->len += (size_t)got;
  emit_lines(r, lb, 0);
}

/* 256 random bits as 64 hex digits; 0 on success. */
static int make_secret(char out[65]) {
  unsigned char r[32];
  size_t got = 0;
  while (got < sizeof r) {
    ssize_t n = getrandom(r + got, sizeof r - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return -1;
    got += (size_t)n;
  }
  for (int i = 0; i < 32; i++) snprintf(out + 2 * i, 3, "%02x", r[i]);
  memset(r, 0, sizeof r);
  return 0;
}

static char elastic_dir[PATH_MAX]; /* --respawn: the folder the ranks share; removed at exit */

static void child(struct rank* ranks, int i, const char* comm_id, const char* secret, int gen) {
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL); /* chorusrun killed: take the rank down too */
  struct sigaction dfl = {.sa_handler = SIG_DFL};
  for (int s = 1; s < NSIG; s++) sigaction(s, &dfl, NULL);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  /* Ranks run in background process groups: only rank 0 may read stdin, and not from a terminal. */
  if (i != 0 || isatty(0)) {
    int fd = open("/dev/null", O_RDONLY);
    if (fd >= 0) dup2(fd, 0), close(fd);
  }
  if (opt.tag) {
    dup2(ranks[i].lb[0].fd, 1); /* the write ends, stored there until the fork */
    dup2(ranks[i].lb[1].fd, 2);
  }
  char v[32];
  setenv("NCCL_COMM_ID", comm_id, 1);
  if (secret[0]) setenv("CHORUS_SECRET", secret, 1);
  snprintf(v, sizeof v, "%d", opt.first + i), setenv("RANK", v, 1);
  snprintf(v, sizeof v, "%d", opt.world), setenv("WORLD_SIZE", v, 1);
  snprintf(v, sizeof v, "%d", i), setenv("LOCAL_RANK", v, 1);
  snprintf(v, sizeof v, "%d", opt.n), setenv("LOCAL_WORLD_SIZE", v, 1);
  if (opt.respawn) {
    snprintf(v, sizeof v, "%d", gen), setenv("CHORUS_RESPAWN", v, 1);
    setenv("CHORUS_ELASTIC_DIR", elastic_dir, 1);
  }
  if (opt.bind != BIND_NONE) bind_rank(i);
  execvp(opt.argv[0], opt.argv);
  fprintf(stderr, "chorusrun: cannot run '%s': %s\n", opt.argv[0], strerror(errno));
  _exit(127);
}

/* Start local rank i (generation gen: 0 for the job's first ranks, k for the k-th replacement); 0 on
 * success. A replacement's rank keeps its output pipes' leftovers: they are printed before it starts. */
static int spawn(struct rank* ranks, int i, const char* comm_id, const char* secret, int gen) {
  struct rank* r = &ranks[i];
  int pp[2][2] = {{-1, -1}, {-1, -1}};
  for (int k = 0; opt.tag && k < 2; k++) {
    /* The previous process's last lines (read_pipe closes the pipe at its end); a pipe still open after
     * that (a child of it holds it) is let go. */
    for (int tries = 0; r->lb[k].fd >= 0 && tries < 4096; tries++) read_pipe(r, &r->lb[k]);
    if (r->lb[k].fd >= 0) {
      emit_lines(r, &r->lb[k], 1);
      close(r->lb[k].fd);
      r->lb[k].fd = -1;
    }
    if (pipe2(pp[k], O_CLOEXEC) != 0) {
      fprintf(stderr, "chorusrun: pipe: %s\n", strerror(errno));
      return -1;
    }
    r->lb[k].fd = pp[k][1]; /* the child dups the write ends */
    r->lb[k].out = k + 1;
  }
  /* Signals stay blocked until the child has dropped our handlers (they write to our pipe). */
  sigset_t all, old;
  sigfillset(&all);
  sigprocmask(SIG_BLOCK, &all, &old);
  pid_t pid = fork();
  if (pid == 0) child(ranks, i, comm_id, secret, gen);
  sigprocmask(SIG_SETMASK, &old, NULL);
  if (pid < 0) {
    fprintf(stderr, "chorusrun: fork: %s\n", strerror(errno));
    return -1;
  }
  setpgid(pid, pid); /* also here, so signals sent right away reach the group */
  r->pid = pid;
  r->running = 1;
  r->status = 0;
  r->exited_at = 0;
  for (int k = 0; opt.tag && k < 2; k++) {
    close(pp[k][1]);
    r->lb[k].fd = pp[k][0];
    fcntl(pp[k][0], F_SETFL, O_NONBLOCK);
  }
  if (!opt.tag) r->lb[0].fd = r->lb[1].fd = -1;
  return 0;
}

/* --respawn's folder: made private, and emptied and removed at the end (only regular files are expected). */
static void elastic_cleanup(void) {
  if (!elastic_dir[0]) return;
  DIR* d = opendir(elastic_dir);
  struct dirent* e;
  while (d && (e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) unlinkat(dirfd(d), e->d_name, 0);
  if (d) closedir(d);
  rmdir(elastic_dir);
}

static void signal_running(struct rank* ranks, int sig) {
  for (int i = 0; i < opt.n; i++)
    if (ranks[i].running && kill(-ranks[i].pid, sig) != 0) kill(ranks[i].pid, sig); /* the rank left its group */
}

static int running_count(struct rank* ranks) {
  int n = 0;
  for (int i = 0; i < opt.n; i++) n += ranks[i].running;
  return n;
}

int main(int argc, char** argv) {
  int rc = parse_args(argc, argv);
  if (rc) return rc;
  if (opt.hosts) return print_hosts();

  char comm_id[300];
  const char* env_id = getenv("NCCL_COMM_ID");
  /* An inherited NCCL_COMM_ID is only used for a part of a multi-host job: a local job always gets
   * its own port, so jobs started from inside another job (ctest under chorusrun) cannot collide. */
  if (opt.port) {
    snprintf(comm_id, sizeof comm_id, "127.0.0.1:%d", opt.port);
  } else if (opt.world != opt.n || opt.first != 0) {
    if (!env_id || !*env_id)
      return usage_error("--first-rank/--world-size need NCCL_COMM_ID (or --port) naming rank 0's host");
    snprintf(comm_id, sizeof comm_id, "%s", env_id);
  } else {
    int port = free_port();
    if (port < 0) {
      fprintf(stderr, "chorusrun: cannot find a free port: %s\n", strerror(errno));
      return 1;
    }
    snprintf(comm_id, sizeof comm_id, "127.0.0.1:%d", port);
  }

  /* The job's secret: inherited (shared with other hosts), else drawn now for a local job. */
  char secret[65] = "";
  const char* env_secret = getenv("CHORUS_SECRET");
  const char* env_file = getenv("CHORUS_SECRET_FILE");
  int have_secret = (env_secret && *env_secret) || (env_file && *env_file);
  if (!have_secret && opt.world == opt.n && opt.first == 0) {
    if (make_secret(secret) != 0) {
      fprintf(stderr, "chorusrun: cannot draw a random job secret: %s\n", strerror(errno));
      return 1;
    }
  } else if (!have_secret) {
    fprintf(stderr, "chorusrun: warning: no CHORUS_SECRET_FILE or CHORUS_SECRET for this part of a multi-host job: "
                    "ranks on other hosts are admitted without proof (see docs/SECURITY.md)\n");
  }

  if (opt.respawn) {
    const char* tmp = getenv("TMPDIR");
    snprintf(elastic_dir, sizeof elastic_dir, "%s/chorus-elastic-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(elastic_dir)) { /* mode 0700 */
      fprintf(stderr, "chorusrun: cannot make a folder for --respawn (%s): %s\n", elastic_dir, strerror(errno));
      return 1;
    }
  }
  int respawned = 0;

  if (pipe2(sigpipe_fds, O_CLOEXEC | O_NONBLOCK) != 0) {
    fprintf(stderr, "chorusrun: pipe: %s\n", strerror(errno));
    return 1;
  }
  struct sigaction sa = {.sa_handler = on_signal, .sa_flags = SA_RESTART | SA_NOCLDSTOP};
  sigemptyset(&sa.sa_mask);
  sigaction(SIGCHLD, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGHUP, &sa, NULL);
  sigaction(SIGQUIT, &sa, NULL); /* Ctrl-\: passed on too (it dumped core and left the ranks running) */
  signal(SIGPIPE, SIG_IGN);

  struct rank* ranks = calloc((size_t)opt.n, sizeof(*ranks));
  if (!ranks) return 1;
  fflush(stdout);
  fflush(stderr);
  for (int i = 0; i < opt.n; i++) {
    ranks[i].rank = opt.first + i;
    ranks[i].lb[0].fd = ranks[i].lb[1].fd = -1;
    if (spawn(ranks, i, comm_id, secret, 0) != 0) {
      signal_running(ranks, SIGKILL);
      return 1;
    }
  }

  uint64_t start = now_ns(), kill_at = 0, drain_until = 0;
  uint64_t timeout_at = opt.timeout > 0 ? start + (uint64_t)(opt.timeout * 1e9) : 0;
  int failed = -1, fail_code = 0, interrupted = 0, timed_out = 0;
  struct pollfd* pfd = calloc(1 + 2 * (size_t)opt.n, sizeof(*pfd));
  struct linebuf** pl = calloc(1 + 2 * (size_t)opt.n, sizeof(*pl));
  struct rank** pr = calloc(1 + 2 * (size_t)opt.n, sizeof(*pr));
  if (!pfd || !pl || !pr) {
    fprintf(stderr, "chorusrun: out of memory\n");
    signal_running(ranks, SIGKILL);
    return 1;
  }

  for (;;) {
    int left = running_count(ranks), np = 0;
    pfd[np++] = (struct pollfd){.fd = sigpipe_fds[0], .events = POLLIN};
    for (int i = 0; i < opt.n; i++)
      for (int k = 0; k < 2; k++)
        if (ranks[i].lb[k].fd >= 0) {
          pl[np] = &ranks[i].lb[k], pr[np] = &ranks[i];
          pfd[np++] = (struct pollfd){.fd = ranks[i].lb[k].fd, .events = POLLIN};
        }
    uint64_t now = now_ns();
    if (left == 0) {
      if (np == 1) break;
      if (!drain_until) drain_until = now + DRAIN_NS; /* a rank's children may hold the pipes open */
      if (now >= drain_until) break;
    }
    uint64_t next = UINT64_MAX;
    if (timeout_at && !timed_out && failed < 0) next = timeout_at;
    if (kill_at && kill_at < next) next = kill_at;
    if (drain_until && drain_until < next) next = drain_until;
    for (int i = 0; i < opt.n; i++)
      if (ranks[i].exited_at && ranks[i].exited_at + EARLY_EXIT_NS < next) next = ranks[i].exited_at + EARLY_EXIT_NS;
    uint64_t wait_ns = next == UINT64_MAX ? 0 : next <= now ? 0 : next - now;
    int wait_ms = next == UINT64_MAX ? -1 : wait_ns > 3600000000000ull ? 3600000 : (int)(wait_ns / 1000000 + 1);
    int pr_n = poll(pfd, (nfds_t)np, wait_ms);
    if (pr_n < 0 && errno != EINTR) {
      fprintf(stderr, "chorusrun: poll: %s\n", strerror(errno));
      break;
    }
    now = now_ns();
    for (int j = 1; pr_n > 0 && j < np; j++)
      if (pfd[j].revents) read_pipe(pr[j], pl[j]);

    unsigned char sigs[64];
    ssize_t ns = read(sigpipe_fds[0], sigs, sizeof sigs);
    for (ssize_t s = 0; s < ns; s++) {
      int sig = sigs[s];
      if (sig == SIGCHLD) continue;
      if (!interrupted) {
        interrupted = sig;
        char nb[32];
        fprintf(stderr, "chorusrun: got %s, passing it to %d running ranks\n", sig_name(sig, nb, sizeof nb),
                running_count(ranks));
        signal_running(ranks, sig);
        if (!kill_at) kill_at = now + 10 * GRACE_NS; /* then insist */
      } else {
        signal_running(ranks, SIGKILL); /* second signal: stop waiting */
      }
    }

    int st;
    pid_t pid;
    while ((pid = waitpid(-1, &st, WNOHANG)) > 0) {
      struct rank* r = NULL;
      for (int i = 0; i < opt.n; i++)
        if (ranks[i].pid == pid) r = &ranks[i];
      if (!r) continue;
      r->running = 0;
      r->status = st;
      int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      int forwarded = WIFSIGNALED(st) && (WTERMSIG(st) == SIGTERM || WTERMSIG(st) == SIGKILL ||
                                         WTERMSIG(st) == interrupted); /* signals we sent it */
      if (failed >= 0 && WIFSIGNALED(st) && !forwarded) {
        /* A crash after the first failure (which may only be its consequence: a peer that saw the
         * crashed rank's sockets close first) is said too; not the ranks our SIGTERM/SIGKILL ended. */
        char nb[32];
        fprintf(stderr, "chorusrun: rank %d (pid %d) also died: killed by signal %s\n", r->rank, (int)pid,
                sig_name(WTERMSIG(st), nb, sizeof nb));
      }
      if (code == 0 && failed < 0 && !timed_out && !interrupted && running_count(ranks)) r->exited_at = now;
      if (code == 0 || failed >= 0 || timed_out || interrupted) continue;
      char nb[32];
      if (respawned < opt.respawn) { /* the survivors go on: a replacement joins them */
        respawned++;
        if (WIFSIGNALED(st))
          fprintf(stderr, "chorusrun: rank %d (pid %d) killed by signal %s; starting replacement %d of %d\n", r->rank,
                  (int)pid, sig_name(WTERMSIG(st), nb, sizeof nb), respawned, opt.respawn);
        else
          fprintf(stderr, "chorusrun: rank %d (pid %d) exited with status %d; starting replacement %d of %d\n",
                  r->rank, (int)pid, code, respawned, opt.respawn);
        if (spawn(ranks, (int)(r - ranks), comm_id, secret, respawned) == 0) continue;
      }
      failed = r->rank, fail_code = code;
      if (WIFSIGNALED(st))
        fprintf(stderr, "chorusrun: rank %d (pid %d) killed by signal %s\n", r->rank, (int)pid,
                sig_name(WTERMSIG(st), nb, sizeof nb));
      else
        fprintf(stderr, "chorusrun: rank %d (pid %d) exited with status %d\n", r->rank, (int)pid, code);
      int n = running_count(ranks);
      if (n) {
        fprintf(stderr, "chorusrun: terminating the %d other running rank%s\n", n, n == 1 ? "" : "s");
        signal_running(ranks, SIGTERM);
        kill_at = now + GRACE_NS;
      }
    }

    for (int i = 0; i < opt.n; i++) {
      struct rank* r = &ranks[i];
      if (!r->exited_at || now < r->exited_at + EARLY_EXIT_NS) continue;
      int n = running_count(ranks);
      if (n && failed < 0 && !timed_out && !interrupted) /* the others wait for it in their next collective */
        fprintf(stderr, "chorusrun: rank %d (pid %d) exited with status 0 while %d other rank%s still run%s\n", r->rank,
                (int)r->pid, n, n == 1 ? "" : "s", n == 1 ? "s" : "");
      r->exited_at = 0; /* once */
    }
    if (timeout_at && !timed_out && failed < 0 && !interrupted && now >= timeout_at && running_count(ranks)) {
      timed_out = 1;
      for (int i = 0; i < opt.n; i++)
        if (ranks[i].running)
          fprintf(stderr, "chorusrun: rank %d (pid %d) did not finish within %g s\n", ranks[i].rank, (int)ranks[i].pid,
                  opt.timeout);
      signal_running(ranks, SIGTERM);
      kill_at = now + GRACE_NS;
    }
    if (kill_at && now >= kill_at && running_count(ranks)) {
      fprintf(stderr, "chorusrun: killing %d rank%s that did not stop after SIGTERM\n", running_count(ranks),
              running_count(ranks) == 1 ? "" : "s");
      signal_running(ranks, SIGKILL);
      kill_at = 0;
    }
  }
  memset(secret, 0, sizeof secret);
  elastic_cleanup();
  for (int i = 0; i < opt.n; i++) free(ranks[i].lb[0].buf), free(ranks[i].lb[1].buf);
  free(ranks), free(pfd), free(pl), free(pr);
  if (failed >= 0) return fail_code;
  if (timed_out) return 124;
  if (interrupted) return 128 + interrupted;
  return 0;
}

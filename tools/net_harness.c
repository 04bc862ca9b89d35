/* chorus-net-harness: drives any NCCL net plugin (ncclNet v12, v11 or v10) through its function table
 * the way NCCL's proxy does, and checks what comes out. It depends on nothing of Chorus but the ABI
 * declarations (src/net/net_abi.h), so it runs as well on aws-ofi-nccl or NCCL's example plugin.
 *
 *   chorus-net-harness [--version 12|11|10] [--dev N] [--timeout S] PLUGIN
 *
 * PLUGIN is a path, a library name, or X for libnccl-net-X.so (as NCCL_NET_PLUGIN). The harness forks
 * right after loading: each process then inits the plugin on its own, as two ranks would (a plugin's
 * state, libfabric's and verbs' above all, does not survive fork). The child receives: listen, hands
 * the 128-byte handle to the parent over a pipe, accepts. The parent sends: connect. Both register two
 * MAP_SHARED host buffers (NCCL hands plugins shared memory), then for a list of sizes keep up to 8
 * messages in flight (a NULL request means "retry"), the receiver checking every byte and the size
 * test reports; then grouped receives with tags (when maxRecvs > 1), an iflush, the closes and
 * finalize. Last, in the parent, bad input: connect with garbage handles must fail without crashing.
 *
 * One line per step: "[send] PASS connect ...". A watchdog (--timeout, default 60 s per step) turns a
 * hang into a FAIL line naming the step; a crash prints the step too. Exit status 0 only when every
 * step passed; 2 when the plugin could not be loaded at all. NCCL_DEBUG=INFO shows the plugin's INFO
 * lines (its WARN lines always show). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../src/net/net_abi.h"

#include "net_harness.h"

const size_t sizes[NSIZES] = {0, 1, 7, 8, 4096, 65536, 1u << 20, 4u << 20, 3, 1000, 12345, 65537, 999999};

const char* role = "main";
const char* volatile g_step = "load";
static unsigned watchdog_s = 60;
int nfail, npass, nwarn;
pid_t child_pid = -1, parent_pid;
static int show_info;

/* ---- output ---- */

void line(const char* what, const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  printf("[%s] %-4s %s\n", role, what, buf);
  fflush(stdout);
  if (!strcmp(what, "FAIL")) nfail++;
  else if (!strcmp(what, "PASS")) npass++;
  else if (!strcmp(what, "WARN")) nwarn++;
}

static void put(const char* s) {
  size_t n = strlen(s);
  while (n) {
    ssize_t w = write(1, s, n);
    if (w <= 0) return;
    s += w, n -= (size_t)w;
  }
}

/* Async-signal-safe: a hang (SIGALRM) or a crash names the step it happened in, then exits. */
static void on_signal(int sig) {
  put("[");
  put(role);
  put(sig == SIGALRM ? "] FAIL watchdog: no progress in the step \"" : "] FAIL crashed in the step \"");
  put(g_step);
  put(sig == SIGALRM ? "\"; killed\n" : "\": ");
  if (sig != SIGALRM) {
    put(sig == SIGSEGV ? "SIGSEGV" : sig == SIGBUS ? "SIGBUS" : sig == SIGFPE ? "SIGFPE" : sig == SIGILL ? "SIGILL" : "SIGABRT");
    put("\n");
  }
  if (child_pid > 0) kill(child_pid, SIGKILL);
  _exit(3);
}

void step(const char* name) {
  g_step = name;
  alarm(watchdog_s);
}

double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void logger(ncclDebugLogLevel level, unsigned long flags, const char* file, int ln, const char* fmt, ...) {
  int warn = level == NCCL_LOG_WARN || level == NCCL_LOG_ABORT;
  if (!warn && !(show_info && (level == NCCL_LOG_INFO || level == NCCL_LOG_TRACE))) return;
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  printf("[%s]      plugin %s %s:%d %s\n", role, warn ? "WARN" : "INFO", file ? file : "?", ln, buf);
  fflush(stdout);
}

/* ---- the table, adapted to v12 as a host adapts it ---- */

ncclNet_v12_t net;
static const ncclNet_v11_t* t11;
static const ncclNet_v10_t* t10;
int version;
static char v10_ctx;

#define PROPS_UP(o, p)                                                                                 \
  do {                                                                                                 \
    memset((o), 0, sizeof(*(o)));                                                                      \
    (o)->name = (p)->name, (o)->pciPath = (p)->pciPath, (o)->guid = (p)->guid;                         \
    (o)->ptrSupport = (p)->ptrSupport, (o)->regIsGlobal = (p)->regIsGlobal;                            \
    (o)->forceFlush = (p)->forceFlush, (o)->speed = (p)->speed, (o)->port = (p)->port;                 \
    (o)->latency = (p)->latency, (o)->maxComms = (p)->maxComms, (o)->maxRecvs = (p)->maxRecvs;         \
    (o)->netDeviceType = (p)->netDeviceType, (o)->netDeviceVersion = (p)->netDeviceVersion;            \
    int nd_ = (p)->vProps.ndevs < 0 ? 0 : (p)->vProps.ndevs;                                           \
    if (nd_ > NCCL_NET_MAX_DEVS_PER_NIC_V11) nd_ = NCCL_NET_MAX_DEVS_PER_NIC_V11;                      \
    (o)->vProps.ndevs = nd_;                                                                           \
    for (int i_ = 0; i_ < nd_; i_++) (o)->vProps.devs[i_] = (p)->vProps.devs[i_];                      \
    (o)->maxP2pBytes = (p)->maxP2pBytes, (o)->maxCollBytes = (p)->maxCollBytes;                        \
    (o)->maxMultiRequestSize = 1, (o)->railId = NCCL_NET_ID_UNDEF, (o)->planeId = NCCL_NET_ID_UNDEF;   \
  } while (0)

static ncclResult_t a11_getProperties(int dev, ncclNetProperties_v12_t* props) {
  ncclNetProperties_v11_t p;
  memset(&p, 0, sizeof(p));
  ncclResult_t rc = t11->getProperties(dev, &p);
  if (rc == ncclSuccess) {
    PROPS_UP(props, &p);
    props->maxMultiRequestSize = p.maxMultiRequestSize;
  }
  return rc;
}
static ncclResult_t a10_getProperties(int dev, ncclNetProperties_v12_t* props) {
  ncclNetProperties_v10_t p;
  memset(&p, 0, sizeof(p));
  ncclResult_t rc = t10->getProperties(dev, &p);
  if (rc == ncclSuccess) PROPS_UP(props, &p);
  return rc;
}
static ncclResult_t a10_init(void** ctx, uint64_t commId, ncclNetCommConfig_v12_t* config, ncclDebugLogger_t log,
                             ncclProfilerCallback_t prof) {
  ncclResult_t rc = t10->init(log, prof);
  if (rc == ncclSuccess) *ctx = &v10_ctx;
  return rc;
}
static ncclResult_t a10_listen(void* ctx, int dev, void* handle, void** listenComm) {
  return t10->listen(dev, handle, listenComm);
}
static ncclResult_t a10_connect(void* ctx, int dev, void* handle, void** sendComm, ncclNetDeviceHandle_v12_t** dc) {
  ncclNetCommConfig_v10_t config = {NCCL_NET_TRAFFIC_CLASS_UNDEF};
  return t10->connect(dev, &config, handle, sendComm, dc);
}

#define COPY_TAIL(a, n)                                                                                 \
  do {                                                                                                 \
    (a)->name = (n)->name, (a)->devices = (n)->devices, (a)->accept = (n)->accept;                     \
    (a)->regMr = (n)->regMr, (a)->regMrDmaBuf = (n)->regMrDmaBuf, (a)->deregMr = (n)->deregMr;         \
    (a)->isend = (n)->isend, (a)->irecv = (n)->irecv, (a)->iflush = (n)->iflush, (a)->test = (n)->test; \
    (a)->closeSend = (n)->closeSend, (a)->closeRecv = (n)->closeRecv;                                  \
    (a)->closeListen = (n)->closeListen;                                                               \
  } while (0)

/* Loads the library and picks the table; exits 2 when that fails. */
void load(const char* arg, int want) {
  char cand[2][600];
  char err[2][400] = {"", ""};
  int n = 1;
  snprintf(cand[0], sizeof(cand[0]), "%s", arg);
  size_t len = strlen(arg);
  int libso = !strncmp(arg, "lib", 3) && len >= 3 && !strcmp(arg + len - 3, ".so");
  if (!strchr(arg, '/') && !libso) snprintf(cand[1], sizeof(cand[1]), "libnccl-net-%s.so", arg), n = 2;
  void* dl = NULL;
  int k = 0;
  for (; k < n && !dl; k++)
    if (!(dl = dlopen(cand[k], RTLD_NOW | RTLD_LOCAL))) {
      const char* e = dlerror();
      snprintf(err[k], sizeof(err[k]), "%s", e ? e : "unknown error");
    }
  if (!dl) {
    if (n == 2)
      FAIL("load: cannot load plugin '%s': %s; nor %s: %s", arg, err[0], cand[1], err[1]);
    else
      FAIL("load: cannot load plugin '%s': %s", arg, err[0]);
    printf("[main] RESULT: FAIL (the plugin could not be loaded)\n");
    exit(2);
  }
  const char* path = cand[k - 1];
  char have[128] = "";
  for (int v = 12; v >= 2; v--) {
    char sym[32];
    snprintf(sym, sizeof(sym), "ncclNetPlugin_v%d", v);
    if (dlsym(dl, sym)) snprintf(have + strlen(have), sizeof(have) - strlen(have), " v%d", v);
  }
  const void* t = NULL;
  for (int v = want ? want : 12; v >= (want ? want : 10) && !t; v--) {
    char sym[32];
    snprintf(sym, sizeof(sym), "ncclNetPlugin_v%d", v);
    if ((t = dlsym(dl, sym))) version = v;
  }
  if (!t) {
    if (want)
      FAIL("load: %s exports no ncclNetPlugin_v%d (it has:%s)", path, want, *have ? have : " none");
    else
      FAIL("load: %s exports no ncclNetPlugin_v12/v11/v10 (it has:%s); the harness drives v10 to v12", path,
           *have ? have : " none");
    printf("[main] RESULT: FAIL (no usable table)\n");
    exit(2);
  }
  memset(&net, 0, sizeof(net));
  if (version == 12) {
    net = *(const ncclNet_v12_t*)t;
  } else if (version == 11) {
    t11 = t;
    COPY_TAIL(&net, t11);
    net.init = t11->init, net.getProperties = a11_getProperties, net.listen = t11->listen;
    net.connect = t11->connect, net.finalize = t11->finalize;
  } else {
    t10 = t;
    COPY_TAIL(&net, t10);
    net.init = a10_init, net.getProperties = a10_getProperties, net.listen = a10_listen, net.connect = a10_connect;
  }
  const char* name = *(const char* const*)t;
  PASS("load: %s, ncclNetPlugin_v%d (exports:%s), name \"%s\"", path, version, have, name ? name : "(NULL)");
  if (!name) FAIL("load: the table has no name (NCCL_NET matches it)");
  /* What NCCL calls without checking for NULL. */
  struct { const char* what; const void* fn; } req[] = {
    {"devices", (void*)net.devices}, {"getProperties", (void*)net.getProperties},
    {"listen", (void*)net.listen}, {"connect", (void*)net.connect}, {"accept", (void*)net.accept},
    {"regMr", (void*)net.regMr}, {"deregMr", (void*)net.deregMr}, {"isend", (void*)net.isend},
    {"irecv", (void*)net.irecv}, {"test", (void*)net.test}, {"closeSend", (void*)net.closeSend},
    {"closeRecv", (void*)net.closeRecv}, {"closeListen", (void*)net.closeListen},
  };
  if (version >= 11 && !net.finalize) FAIL("table: finalize is NULL (NCCL calls it for every init)");
  if (version == 12 && !((const ncclNet_v12_t*)t)->init) FAIL("table: init is NULL");
  if (version == 11 && !t11->init) FAIL("table: init is NULL");
  if (version == 10 && !t10->init) FAIL("table: init is NULL");
  for (size_t i = 0; i < sizeof(req) / sizeof(req[0]); i++)
    if (!req[i].fn) FAIL("table: %s is NULL", req[i].what);
  if (nfail) {
    printf("[main] RESULT: FAIL (incomplete table)\n");
    exit(1);
  }
}

/* ---- helpers ---- */

uint8_t pat(size_t size, int idx, size_t j) {
  uint32_t x = (uint32_t)j * 2654435761u ^ (uint32_t)size * 40503u ^ ((uint32_t)idx * 97u + 13u);
  return (uint8_t)(x ^ (x >> 11) ^ (x >> 23));
}
void fill(uint8_t* p, size_t size, int idx) {
  for (size_t j = 0; j < size; j++) p[j] = pat(size, idx, j);
}
/* -1 when p holds message idx of this size, else the first wrong byte's offset. */
long check(const uint8_t* p, size_t size, int idx) {
  for (size_t j = 0; j < size; j++)
    if (p[j] != pat(size, idx, j)) return (long)j;
  return -1;
}

void* map_shared(size_t len) {
  void* p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? NULL : p;
}

/* The other process is still there (the parent reaps a dead child and reports it once). */
int child_status = -1;
int peer_alive(void) {
  if (child_pid > 0) {
    if (child_status >= 0) return 0;
    int st;
    if (waitpid(child_pid, &st, WNOHANG) == child_pid) {
      child_status = st;
      return 0;
    }
    return 1;
  }
  return getppid() == parent_pid;
}

int io_full(int fd, void* buf, size_t n, int rd) {
  double end = now_s() + STEP_TIMEOUT_S;
  uint8_t* p = buf;
  while (n) {
    struct pollfd pf = {fd, (short)(rd ? POLLIN : POLLOUT), 0};
    int r = poll(&pf, 1, 100);
    if (r < 0 && errno != EINTR) return -1;
    if (r <= 0) {
      if (now_s() > end || !peer_alive()) return -1;
      continue;
    }
    ssize_t k = rd ? read(fd, p, n) : write(fd, p, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return -1;
    p += k, n -= (size_t)k;
  }
  return 0;
}

/* Polls a request to completion; 0 done (sizes filled), -1 error or timeout. */
int wait_req(void* req, int* sz, const char* what) {
  double end = now_s() + STEP_TIMEOUT_S;
  for (;;) {
    int done = 0;
    ncclResult_t rc = net.test(req, &done, sz);
    if (rc != ncclSuccess) {
      FAIL("%s: test returned %d", what, (int)rc);
      return -1;
    }
    if (done) return 0;
    if (now_s() > end || !peer_alive()) {
      FAIL("%s: not done after %d s%s", what, STEP_TIMEOUT_S, peer_alive() ? "" : " (the peer exited)");
      return -1;
    }
    sched_yield();
  }
}

/* ---- one side's setup: init, devices, properties ---- */

void* ctx;
int dev;
ncclNetProperties_v12_t props;

int setup(int print) {
  step("init");
  ncclNetCommConfig_v12_t config = {NCCL_NET_TRAFFIC_CLASS_UNDEF};
  ncclResult_t rc = net.init(&ctx, 0x5eed, &config, logger, NULL);
  if (rc != ncclSuccess) {
    FAIL("init returned %d", (int)rc);
    return -1;
  }
  if (print) PASS("init (ctx %p)", ctx);
  step("devices");
  int ndev = 0;
  rc = net.devices(&ndev);
  if (rc != ncclSuccess || ndev <= 0) {
    FAIL("devices returned %d with %d devices (NCCL disables such a plugin)", (int)rc, ndev);
    return -1;
  }
  if (dev >= ndev) {
    FAIL("devices: %d, but --dev %d was asked for", ndev, dev);
    return -1;
  }
  if (print) PASS("devices: %d", ndev);
  step("getProperties");
  for (int d = 0; d < ndev; d++) {
    ncclNetProperties_v12_t p;
    memset(&p, 0, sizeof(p));
    rc = net.getProperties(d, &p);
    if (rc != ncclSuccess) {
      FAIL("getProperties(%d) returned %d", d, (int)rc);
      return -1;
    }
    int ok = p.maxP2pBytes > 0 && p.maxP2pBytes <= NCCL_MAX_NET_SIZE_BYTES && (p.ptrSupport & NCCL_PTR_HOST) &&
             p.netDeviceType == NCCL_NET_DEVICE_HOST && p.name && p.maxRecvs >= 1 && p.maxComms >= 1;
    if (print || !ok)
      line(ok ? "PASS" : "FAIL",
           "dev %d: name %s pci %s guid 0x%llx ptr 0x%x regIsGlobal %d forceFlush %d speed %d Mb/s port %d "
           "latency %.1f us maxComms %d maxRecvs %d devType %d/%d vProps %d maxP2p %zu maxColl %zu multiReq %d "
           "rail %d plane %d",
           d, p.name ? p.name : "(NULL)", p.pciPath ? p.pciPath : "(none)", (unsigned long long)p.guid, p.ptrSupport,
           p.regIsGlobal, p.forceFlush, p.speed, p.port, (double)p.latency, p.maxComms, p.maxRecvs,
           (int)p.netDeviceType, p.netDeviceVersion, p.vProps.ndevs, p.maxP2pBytes, p.maxCollBytes,
           p.maxMultiRequestSize, p.railId, p.planeId);
    if (!ok)
      FAIL("dev %d: NCCL needs maxP2pBytes in (0, 1 TiB], NCCL_PTR_HOST, a host device, a name, maxRecvs and "
           "maxComms >= 1", d);
    if (d == dev) props = p;
  }
  return nfail ? -1 : 0;
}

void finalize(void) {
  step("finalize");
  if (!net.finalize) {
    PASS("finalize: none in a v10 table");
    return;
  }
  ncclResult_t rc = net.finalize(ctx);
  if (rc != ncclSuccess) FAIL("finalize returned %d", (int)rc);
  else PASS("finalize");
}

/* ---- the receiver (child) ---- */

int c2p[2];
uint8_t* buf[2];
size_t buflen[2] = {(size_t)INFLIGHT * SLOT, (size_t)GMAX * GSLOT};
void* mh[2];

int register_buffers(void* comm, const char* what) {
  step("regMr");
  for (int b = 0; b < 2; b++) {
    if (!(buf[b] = map_shared(buflen[b]))) {
      FAIL("mmap of %zu bytes: %s", buflen[b], strerror(errno));
      return -1;
    }
    ncclResult_t rc = net.regMr(comm, buf[b], buflen[b], NCCL_PTR_HOST, &mh[b]);
    if (rc != ncclSuccess) {
      FAIL("regMr(%s, %zu bytes of MAP_SHARED host memory) returned %d", what, buflen[b], (int)rc);
      return -1;
    }
  }
  PASS("regMr: 2 MAP_SHARED host buffers (%zu and %zu bytes) on the %s", buflen[0], buflen[1], what);
  return 0;
}

void deregister(void* comm) {
  step("deregMr");
  int bad = 0;
  for (int b = 0; b < 2; b++) {
    ncclResult_t rc = net.deregMr(comm, mh[b]);
    if (rc != ncclSuccess) FAIL("deregMr(buffer %d) returned %d", b, (int)rc), bad = 1;
  }
  if (!bad) PASS("deregMr: 2 buffers");
}

size_t max_size(void) { return props.maxP2pBytes; }

static void usage(void) {
  fprintf(stderr,
          "usage: chorus-net-harness [--version 12|11|10] [--dev N] [--timeout S] PLUGIN\n"
          "  PLUGIN: a path, a library name, or X for libnccl-net-X.so (as NCCL_NET_PLUGIN)\n");
  exit(2);
}

int main(int argc, char** argv) {
  int want = 0;
  const char* plugin = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--version") && i + 1 < argc) {
      want = atoi(argv[++i]);
      if (want < 10 || want > 12) usage();
    } else if (!strcmp(argv[i], "--dev") && i + 1 < argc) {
      dev = atoi(argv[++i]);
    } else if (!strcmp(argv[i], "--timeout") && i + 1 < argc) {
      watchdog_s = (unsigned)atoi(argv[++i]);
    } else if (argv[i][0] == '-' || plugin) {
      usage();
    } else {
      plugin = argv[i];
    }
  }
  if (!plugin) usage();
  const char* dbg = getenv("NCCL_DEBUG");
  show_info = dbg && (!strcasecmp(dbg, "INFO") || !strcasecmp(dbg, "TRACE"));
  setvbuf(stdout, NULL, _IOLBF, 0);
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = on_signal;
  int sigs[] = {SIGALRM, SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
  for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++) sigaction(sigs[i], &sa, NULL);
  signal(SIGPIPE, SIG_IGN);

  step("load");
  load(plugin, want);
  if (pipe(c2p)) {
    FAIL("pipe: %s", strerror(errno));
    return 1;
  }
  parent_pid = getpid();
  fflush(stdout);
  pid_t pid = fork();
  if (pid < 0) {
    FAIL("fork: %s", strerror(errno));
    return 1;
  }
  if (pid == 0) {
    close(c2p[0]);
    receiver();
    _exit(nfail ? 1 : 0);
  }
  close(c2p[1]);
  child_pid = pid;
  sender();
  if (child_pid > 0) { /* the sender stopped early: the receiver may wait for it */
    role = "main";
    if (child_status < 0) {
      kill(child_pid, SIGKILL);
      waitpid(child_pid, NULL, 0);
      FAIL("receiver killed: the sender stopped first");
    } else {
      FAIL("receiver ended early (%s %d)", WIFEXITED(child_status) ? "exit" : "signal",
           WIFEXITED(child_status) ? WEXITSTATUS(child_status) : WTERMSIG(child_status));
    }
  }
  alarm(0);
  role = "main";
  if (nfail)
    printf("[main] RESULT: FAIL (%d failed, %d passed in this process, %d warnings)\n", nfail, npass, nwarn);
  else
    printf("[main] RESULT: PASS (%d steps passed in this process, %d warnings; the receiver's own passed too)\n",
           npass, nwarn);
  return nfail ? 1 : 0;
}

/* chorus-net-harness, the two roles (net_harness.h): the receiver (the child: listen, accept, receive
 * and check every size, grouped receives, flush, close) and the sender (the parent: connect, send,
 * grouped sends, then garbage handles that must be refused). */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "net_harness.h"

static int recv_size(void* rc_, size_t s, int count) {
  void* req[INFLIGHT] = {0};
  size_t psz[INFLIGHT];
  int posted = 0, done = 0, nulls = 0, bad = 0;
  double end = now_s() + STEP_TIMEOUT_S;
  while (done < count) {
    while (posted < count && posted - done < INFLIGHT) {
      int slot = posted % INFLIGHT;
      uint8_t* p = buf[0] + (size_t)slot * SLOT;
      psz[slot] = (posted & 1) ? s + SLACK : s;
      memset(p + s, CANARY, SLACK + 16); /* bytes past the message must stay untouched */
      if (posted & 1) memset(p, CANARY, s);
      void* data = p;
      size_t size = psz[slot];
      int tag = TAG;
      void* r = NULL;
      ncclResult_t rc = net.irecv(rc_, 1, &data, &size, &tag, &mh[0], NULL, &r);
      if (rc != ncclSuccess) {
        FAIL("size %zu: irecv #%d returned %d", s, posted, (int)rc);
        return -1;
      }
      if (!r) {
        nulls++;
        break;
      }
      req[slot] = r, posted++;
    }
    int slot = done % INFLIGHT, sz[1] = {-1}, d = 0;
    ncclResult_t rc = net.test(req[slot], &d, sz);
    if (rc != ncclSuccess) {
      FAIL("size %zu: test of receive #%d returned %d", s, done, (int)rc);
      return -1;
    }
    if (d) {
      const uint8_t* p = buf[0] + (size_t)slot * SLOT;
      long at = check(p, s, done);
      if (sz[0] != (int)s) {
        if (bad++ < 3) FAIL("size %zu: receive #%d (posted %zu bytes): test reports %d bytes", s, done, psz[slot], sz[0]);
      } else if (at >= 0) {
        if (bad++ < 3)
          FAIL("size %zu: receive #%d: byte %ld is 0x%02x, expected 0x%02x", s, done, at, p[at], pat(s, done, (size_t)at));
      } else {
        for (size_t j = s; j < s + SLACK + 16; j++)
          if (p[j] != CANARY) {
            if (bad++ < 3) FAIL("size %zu: receive #%d wrote past the message (byte %zu)", s, done, j);
            break;
          }
      }
      done++;
      end = now_s() + STEP_TIMEOUT_S;
    } else if (now_s() > end || !peer_alive()) {
      FAIL("size %zu: receive #%d not done after %d s (%d posted)%s", s, done, STEP_TIMEOUT_S, posted,
           peer_alive() ? "" : "; the sender exited");
      return -1;
    } else {
      sched_yield();
    }
  }
  if (!bad) PASS("size %zu x%d: every byte and size right (%d NULL irecv retries)", s, count, nulls);
  return bad ? -1 : 0;
}

static int count_for(size_t s) { return s >= (1u << 20) ? 8 : 24; }

static size_t gsize(int round, int k) { return (size_t)1000 * (size_t)(k + 1) + (size_t)round * 7; }
static int gidx(int round, int k) { return 1000 + round * GMAX + k; }
static int group_n(void) { return props.maxRecvs > GMAX ? GMAX : props.maxRecvs; }

static int recv_grouped(void* rcomm) {
  int n = group_n();
  for (int round = 0; round < GROUNDS; round++) {
    void* data[GMAX];
    size_t sz[GMAX];
    int tags[GMAX];
    void* mhs[GMAX];
    for (int k = 0; k < n; k++) {
      data[k] = buf[1] + (size_t)k * GSLOT, sz[k] = GSLOT, tags[k] = GTAG + k, mhs[k] = mh[1];
      memset(data[k], CANARY, GSLOT);
    }
    void* r = NULL;
    double end = now_s() + STEP_TIMEOUT_S;
    while (!r) {
      ncclResult_t rc = net.irecv(rcomm, n, data, sz, tags, mhs, NULL, &r);
      if (rc != ncclSuccess) {
        FAIL("grouped irecv (n %d) returned %d", n, (int)rc);
        return -1;
      }
      if (!r && (now_s() > end || !peer_alive())) {
        FAIL("grouped irecv (n %d): still a NULL request after %d s", n, STEP_TIMEOUT_S);
        return -1;
      }
    }
    int got[GMAX];
    for (int k = 0; k < n; k++) got[k] = -1;
    if (wait_req(r, got, "grouped receive")) return -1;
    for (int k = 0; k < n; k++) {
      size_t s = gsize(round, k);
      long at = check(data[k], s, gidx(round, k));
      if (got[k] != (int)s) {
        FAIL("grouped receive round %d: buffer %d (tag %d): test reports %d bytes, sent %zu", round, k, GTAG + k,
             got[k], s);
        return -1;
      }
      if (at >= 0) {
        FAIL("grouped receive round %d: buffer %d (tag %d): byte %ld wrong (a send landed in the wrong buffer?)",
             round, k, GTAG + k, at);
        return -1;
      }
    }
  }
  PASS("grouped receives: %d rounds of n %d (tags %d..%d, sent in reverse tag order): data and sizes right", GROUNDS,
       n, GTAG, GTAG + n - 1);
  return 0;
}

void receiver(void) {
  role = "recv";
  if (setup(0)) return;
  step("listen");
  uint8_t handle[NCCL_NET_HANDLE_MAXSIZE];
  memset(handle, 0, sizeof(handle));
  void* lc = NULL;
  ncclResult_t rc = net.listen(ctx, dev, handle, &lc);
  if (rc != ncclSuccess || !lc) {
    FAIL("listen(dev %d) returned %d, listenComm %p", dev, (int)rc, lc);
    return;
  }
  PASS("listen(dev %d)", dev);
  if (io_full(c2p[1], handle, sizeof(handle), 0)) {
    FAIL("could not pass the handle to the sender");
    return;
  }
  step("accept");
  void* rcomm = NULL;
  int calls = 0;
  double t0 = now_s();
  while (!rcomm) {
    calls++;
    rc = net.accept(lc, &rcomm, NULL);
    if (rc != ncclSuccess) {
      FAIL("accept returned %d (call %d)", (int)rc, calls);
      return;
    }
    if (!rcomm) {
      if (now_s() - t0 > STEP_TIMEOUT_S || !peer_alive()) {
        FAIL("accept: no recvComm after %d s (%d calls)", STEP_TIMEOUT_S, calls);
        return;
      }
      usleep(100);
    }
  }
  PASS("accept: recvComm after %d calls (%.1f ms)", calls, (now_s() - t0) * 1e3);
  if (register_buffers(rcomm, "recvComm")) return;
  for (size_t i = 0; i < NSIZES; i++) {
    if (sizes[i] > max_size()) continue;
    step("receive");
    if (recv_size(rcomm, sizes[i], count_for(sizes[i]))) break;
  }
  if (!nfail && group_n() > 1) {
    step("grouped receive");
    recv_grouped(rcomm);
  } else if (!nfail) {
    line("SKIP", "grouped receives: maxRecvs %d", props.maxRecvs);
  }
  if (!nfail) {
    step("iflush");
    if (!net.iflush) {
      line("SKIP", "iflush: NULL in the table");
    } else {
      void* data = buf[0];
      int size = 4096;
      void* r = NULL;
      rc = net.iflush(rcomm, 1, &data, &size, &mh[0], &r);
      if (rc != ncclSuccess) FAIL("iflush of a 4096-byte host receive returned %d", (int)rc);
      else if (!r) PASS("iflush: NULL request (nothing to flush for host memory)");
      else if (wait_req(r, NULL, "iflush") == 0) PASS("iflush: request completed");
    }
  }
  uint8_t verdict = nfail ? 1 : 0;
  step("report");
  if (io_full(c2p[1], &verdict, 1, 0)) FAIL("could not report to the sender");
  deregister(rcomm);
  step("closeRecv");
  rc = net.closeRecv(rcomm);
  if (rc != ncclSuccess) FAIL("closeRecv returned %d", (int)rc);
  else PASS("closeRecv");
  step("closeListen");
  rc = net.closeListen(lc);
  if (rc != ncclSuccess) FAIL("closeListen returned %d", (int)rc);
  else PASS("closeListen");
  finalize();
}

/* ---- the sender (parent) ---- */

static int send_size(void* sc, size_t s, int count) {
  void* req[INFLIGHT] = {0};
  int posted = 0, done = 0, nulls = 0, filled = -1;
  double end = now_s() + STEP_TIMEOUT_S;
  while (done < count) {
    while (posted < count && posted - done < INFLIGHT) {
      int slot = posted % INFLIGHT;
      uint8_t* p = buf[0] + (size_t)slot * SLOT;
      if (filled < posted) fill(p, s, posted), filled = posted;
      void* r = NULL;
      ncclResult_t rc = net.isend(sc, p, s, TAG, mh[0], NULL, &r);
      if (rc != ncclSuccess) {
        FAIL("size %zu: isend #%d returned %d", s, posted, (int)rc);
        return -1;
      }
      if (!r) {
        nulls++;
        break;
      }
      req[slot] = r, posted++;
    }
    int d = 0;
    ncclResult_t rc = net.test(req[done % INFLIGHT], &d, NULL); /* NCCL passes no sizes for sends */
    if (rc != ncclSuccess) {
      FAIL("size %zu: test of send #%d returned %d", s, done, (int)rc);
      return -1;
    }
    if (d) {
      done++;
      end = now_s() + STEP_TIMEOUT_S;
    } else if (now_s() > end || !peer_alive()) {
      FAIL("size %zu: send #%d not done after %d s (%d posted)%s", s, done, STEP_TIMEOUT_S, posted,
           peer_alive() ? "" : "; the receiver exited");
      return -1;
    } else {
      sched_yield();
    }
  }
  PASS("size %zu x%d sent, up to %d in flight (%d NULL isend retries)", s, count, INFLIGHT, nulls);
  return 0;
}

static int send_grouped(void* sc) {
  int n = group_n();
  for (int round = 0; round < GROUNDS; round++) {
    void* req[GMAX];
    for (int k = n - 1; k >= 0; k--) { /* reverse tag order: the tags must steer each one */
      uint8_t* p = buf[1] + (size_t)k * GSLOT;
      size_t s = gsize(round, k);
      fill(p, s, gidx(round, k));
      req[k] = NULL;
      double end = now_s() + STEP_TIMEOUT_S;
      while (!req[k]) {
        ncclResult_t rc = net.isend(sc, p, s, GTAG + k, mh[1], NULL, &req[k]);
        if (rc != ncclSuccess) {
          FAIL("grouped round %d: isend (tag %d) returned %d", round, GTAG + k, (int)rc);
          return -1;
        }
        if (!req[k] && (now_s() > end || !peer_alive())) {
          FAIL("grouped round %d: isend (tag %d) still NULL after %d s", round, GTAG + k, STEP_TIMEOUT_S);
          return -1;
        }
      }
    }
    for (int k = n - 1; k >= 0; k--)
      if (wait_req(req[k], NULL, "grouped send")) return -1;
  }
  PASS("grouped sends: %d rounds of %d messages, tags %d..%d in reverse order", GROUNDS, n, GTAG, GTAG + n - 1);
  return 0;
}

/* A connect with a bad handle must not crash. must_fail (a handle no plugin could have written, which
 * it can tell from the bytes alone): it must return an error, within 2 s. Else (a handle that may name an
 * address or listener that simply is not there) pending or even connecting is only a warning. */
static void bad_connect(const char* what, const uint8_t* h, int must_fail) {
  step(what);
  uint8_t handle[NCCL_NET_HANDLE_MAXSIZE];
  memcpy(handle, h, sizeof(handle));
  void* sc = NULL;
  ncclNetDeviceHandle_v12_t* dc = NULL;
  double t0 = now_s();
  int calls = 0;
  for (;;) {
    calls++;
    ncclResult_t rc = net.connect(ctx, dev, handle, &sc, &dc);
    if (rc != ncclSuccess) {
      PASS("bad handle (%s): connect returned %d after %d calls (%.1f ms)", what, (int)rc, calls,
           (now_s() - t0) * 1e3);
      return;
    }
    if (sc) {
      if (must_fail)
        FAIL("bad handle (%s): connect succeeded (sendComm %p)", what, sc);
      else /* e.g. a plugin whose connect does not wait for the receiver's answer, as NCCL's Socket */
        line("WARN", "bad handle (%s): connect succeeded after %d calls (the plugin does not wait for an answer "
             "from the listener); closed", what, calls);
      step("closeSend after a bad handle");
      ncclResult_t rc = net.closeSend(sc);
      if (rc != ncclSuccess && must_fail) FAIL("closeSend of that sendComm returned %d", (int)rc);
      return;
    }
    if (now_s() - t0 > 2.0) break;
    usleep(1000);
  }
  if (must_fail)
    FAIL("bad handle (%s): no error in 2 s (%d calls, still pending): the plugin does not validate its handles",
         what, calls);
  else
    line("WARN", "bad handle (%s): still pending after 2 s (%d calls); no crash", what, calls);
}

static void bad_input(const uint8_t* good) {
  uint8_t h[NCCL_NET_HANDLE_MAXSIZE];
  uint32_t seed = 0x9e3779b9u;
  for (int rep = 0; rep < 2; rep++) {
    for (size_t i = 0; i < sizeof(h); i++) seed = seed * 1664525u + 1013904223u, h[i] = (uint8_t)(seed >> 24);
    bad_connect(rep ? "random bytes #2" : "random bytes #1", h, 0);
  }
  memset(h, 0, sizeof(h));
  bad_connect("zeroed", h, 1);
  memset(h, 0xff, sizeof(h));
  bad_connect("all 0xff: every length field huge", h, 1);
  memcpy(h, good, sizeof(h));
  memset(h + 4, 0xff, sizeof(h) - 4);
  bad_connect("real handle, bytes 4.. set to 0xff: huge lengths", h, 1);
  for (int off = 4; off < 32; off += 4) {
    memcpy(h, good, sizeof(h));
    memset(h + off, 0xff, 4);
    static char name[8][64];
    snprintf(name[off / 4], sizeof(name[0]), "real handle, word at byte %d set to 0xffffffff", off);
    bad_connect(name[off / 4], h, 0);
  }
  bad_connect("stale: the listener closed", good, 0);
}

void sender(void) {
  role = "send";
  if (setup(1)) return;
  step("handle");
  uint8_t handle[NCCL_NET_HANDLE_MAXSIZE];
  if (io_full(c2p[0], handle, sizeof(handle), 1)) {
    FAIL("no handle from the receiver (it failed before listen: see its lines)");
    return;
  }
  step("connect");
  void* sc = NULL;
  ncclNetDeviceHandle_v12_t* dc = NULL;
  int calls = 0;
  double t0 = now_s();
  while (!sc) {
    calls++;
    ncclResult_t rc = net.connect(ctx, dev, handle, &sc, &dc);
    if (rc != ncclSuccess) {
      FAIL("connect returned %d (call %d)", (int)rc, calls);
      return;
    }
    if (!sc) {
      if (now_s() - t0 > STEP_TIMEOUT_S || !peer_alive()) {
        FAIL("connect: no sendComm after %d s (%d calls)", STEP_TIMEOUT_S, calls);
        return;
      }
      usleep(100);
    }
  }
  PASS("connect: sendComm after %d calls (%.1f ms)", calls, (now_s() - t0) * 1e3);
  if (register_buffers(sc, "sendComm")) return;
  int ok = 1;
  for (size_t i = 0; i < NSIZES && ok; i++) {
    if (sizes[i] > max_size()) {
      line("SKIP", "size %zu: above maxP2pBytes %zu", sizes[i], max_size());
      continue;
    }
    step("send");
    ok = send_size(sc, sizes[i], count_for(sizes[i])) == 0;
  }
  if (ok && group_n() > 1) {
    step("grouped send");
    ok = send_grouped(sc) == 0;
  }
  if (ok) {
    step("receiver's verdict");
    uint8_t verdict = 1;
    if (io_full(c2p[0], &verdict, 1, 1)) FAIL("no verdict from the receiver");
    else if (verdict) FAIL("the receiver found errors (its lines above)");
    else PASS("receiver: all data checked");
  }
  deregister(sc);
  step("closeSend");
  ncclResult_t rc = net.closeSend(sc);
  if (rc != ncclSuccess) FAIL("closeSend returned %d", (int)rc);
  else PASS("closeSend");

  step("wait for the receiver");
  while (peer_alive()) usleep(1000);
  role = "main";
  if (WIFEXITED(child_status) && WEXITSTATUS(child_status) == 0) {
    PASS("receiver exited 0");
  } else if (WIFEXITED(child_status)) {
    FAIL("receiver exited with %d", WEXITSTATUS(child_status));
  } else {
    FAIL("receiver killed by signal %d", WTERMSIG(child_status));
  }
  role = "send";
  child_pid = -1;
  bad_input(handle);
  finalize();
}

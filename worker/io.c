/* io: the compute thread's links, events and failure.
 *
 * Reading: once a peer's HELLO is admitted (net.c, on the loop thread), the
 * socket belongs to the run's compute thread: whenever it waits for an
 * input it reads every link without blocking, each frame straight into the
 * place its header names (route.c decides where), so a frame reaches the
 * action that needs it without waking another thread. It spins a little on
 * the sockets before it sleeps in poll() (when its rank has a core of its
 * own), and takes a due snapshot (snaprun.c) in the first wait that would
 * idle. While it computes, the kernel's socket buffers hold what arrives,
 * and a sender whose socket is full lets its loop thread write the rest.
 *
 * Sending: a frame goes straight to the socket when the loop has nothing
 * queued on that link, its CRC computed here while the data is hot in
 * this core's cache; what the socket does not take goes to the loop as an
 * event. Events (event.h) and the run's failure are said here too, and the
 * run's context (rctx.h) is bound to these functions. */
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "log.h"
#include "run.h"
#include "sysres.h"

/* How long a waiting compute thread polls its sockets before it sleeps in
 * poll(): a sleeping thread's wake-up costs 20-80 us on the VMs we measure
 * (its core goes idle), and the waits of a pipeline whose ranks each have a
 * core are mostly shorter than this (bench/README.md). It yields between
 * polls: a peer or our own loop thread placed on this core runs at once
 * (yielding only every 100 us, or spinning on `pause`, made a 64 KiB
 * ping-pong 12.5 -> 18-30 us a hop on a quiet 2-core VM).
 * Ranks that share cores (more compute threads on the host than CPUs) do
 * not spin at all: the core a spinner burns is one a peer needs; nor while
 * our loop thread writes queued frames (loop_writing). The host's load
 * average is no guide: a pipeline's own spinning ranks raise it, and a
 * guard on it switched the spin off after every busy minute. */
#define SPIN_SECONDS 1e-3
/* Bytes read at once: the reader's CRC then runs on what the copy just
 * put in this core's L2 (a read of a whole 16 MiB tensor left most of it
 * in memory for the CRC to fetch again). */
#define RECV_PIECE ((size_t)256 << 10)
#define MAX_POLL 64 /* links polled at once; beyond, the eventfd and the spin still catch arrivals */
/* No bound of its own: frame_dest (run.c) checks every frame's size, a
 * chunked tensor's whole size too, against where it goes before a byte of
 * payload is read; the frames it leaves to the reader's buffer are a norm
 * partial (8 bytes) and BYE (at most PW_FRAME_HELLO_MAX). */
#define MAX_PAYLOAD SIZE_MAX

static int lost(pw_run *r, int k, const char *why) {
  return pw_exec_fail(r, PW_EPEER, NULL, "lost peer rank %d (%s): %s", k, r->peers[k].addr, why);
}

/* The link itself broke (no BYE): the peer's process or host is gone, and
 * the coordinator is told which rank, so it can fence that worker. */
static int lost_link(pw_run *r, int k, const char *why) {
  uv_mutex_lock(&r->sh.mu);
  if (r->sh.why.lost_rank < 0) r->sh.why.lost_rank = k;
  uv_mutex_unlock(&r->sh.mu);
  return lost(r, k, why);
}

/* Reads what link k has, without blocking, up to the end of the first
 * frame it completes: the waiter then looks whether its input is in
 * before reading on (a peer's snapshot behind an activation is read in a
 * later wait, not before the action the activation starts). Returns the
 * frames completed (0 or 1) or a negative code with r->sh.why.error set. */
static int drain(pw_run *r, int k) {
  pw_inlink *in = &r->cp.io.in[k];
  char b[512];
  while (in->fd >= 0) {
    void *buf;
    size_t len;
    pw_frame_reader_next_buf(&in->rd, &buf, &len);
    if (!len) return lost(r, k, "out of memory for a frame");
    ssize_t n = recv(in->fd, buf, len < RECV_PIECE ? len : RECV_PIECE, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0 && in->bye) { /* an orderly end after its BYE */
        in->fd = -1;
        return 0;
      }
      return lost_link(r, k, n == 0 ? "peer closed the link" : strerror(errno));
    }
    pw_frame_event ev;
    pw_err err = {0};
    int rc = pw_frame_reader_advance(&in->rd, (size_t)n, &ev, &err);
    if (rc < 0) return lost(r, k, pw_err_str(&err, b, sizeof b));
    if (rc == PW_FRAME_HEADER) {
      if (ev.hdr.kind == PW_FRAME_HELLO) return lost(r, k, "second HELLO");
      if (ev.hdr.kind == PW_FRAME_BYE) continue; /* its reason goes to the reader's buffer */
      void *dst = NULL;
      if (pw_route_dest(r, k, &ev.hdr, &dst, &err)) return lost(r, k, pw_err_str(&err, b, sizeof b));
      if (pw_frame_reader_set_dest(&in->rd, dst)) return lost(r, k, "frame reader refused its destination");
    } else if (rc == PW_FRAME_DONE) {
      if (ev.hdr.kind == PW_FRAME_HELLO) return lost(r, k, "second HELLO");
      if (ev.hdr.kind == PW_FRAME_BYE) {
        if (ev.len) { /* the peer is aborting: say why */
          char why[PW_FRAME_HELLO_MAX + 1];
          memcpy(why, ev.payload, ev.len);
          why[ev.len] = 0;
          for (size_t i = 0; i < ev.len; i++)
            if ((unsigned char)why[i] < 32) why[i] = ' ';
          uv_mutex_lock(&r->sh.mu);
          if (r->sh.why.aborted_rank < 0 && r->sh.why.lost_rank < 0) r->sh.why.aborted_rank = k;
          uv_mutex_unlock(&r->sh.mu);
          return pw_exec_fail(r, PW_EPEER, NULL, "peer rank %d aborted: %s", k, why);
        }
        in->bye = 1;
        continue;
      }
      if (pw_route_done(r, k, &ev.hdr, ev.payload, &err)) return lost(r, k, pw_err_str(&err, b, sizeof b));
      return 1;
    }
  }
  return 0;
}

/* Links the loop admitted since we last looked. */
static void refresh(pw_run *r) {
  uv_mutex_lock(&r->sh.mu);
  for (int k = 0; k < r->cx.n_ranks; k++)
    if (r->sh.in_fd[k] >= 0 && r->cp.io.in[k].fd < 0 && !r->cp.io.in[k].bye) {
      r->cp.io.in[k].fd = r->sh.in_fd[k];
      pw_frame_reader_free(&r->cp.io.in[k].rd);
      pw_frame_reader_init(&r->cp.io.in[k].rd, MAX_PAYLOAD);
    }
  uv_mutex_unlock(&r->sh.mu);
}

static int drain_all(pw_run *r) {
  int done = 0;
  for (int k = 0; k < r->cx.n_ranks; k++) {
    int rc = drain(r, k);
    if (rc < 0) return rc;
    done += rc;
  }
  return done;
}

int pw_exec_same_host(const pw_run *r, int a, int b) {
  return !strcmp(r->peers[a].host, r->peers[b].host);
}

void pw_exec_spin_init(pw_run *r) {
  int local = 0;
  for (int k = 0; k < r->cx.n_ranks; k++) local += pw_exec_same_host(r, r->cx.rank, k);
  /* the cores the cgroup and affinity mask grant, not the machine's */
  long cpus = r->host.cores > 0 ? r->host.cores : pw_sysres_cores();
  long threads = (long)local * (r->host.threads > 0 ? r->host.threads : 1);
  r->cp.io.spin = cpus > 0 && threads > cpus ? 0 : SPIN_SECONDS;
}

/* Frames our loop thread is still writing (a snapshot's, a large
 * tensor's): it needs a core for them, and a spinning compute thread would
 * take this one while a peer computes on the other. */
static int loop_writing(pw_run *r) {
  int n = 0;
  uv_mutex_lock(&r->sh.out.mu);
  for (int k = 0; k < r->cx.n_ranks && !n; k++) n = r->sh.out.link[k].queued;
  uv_mutex_unlock(&r->sh.out.mu);
  return n > 0;
}

static int wait_slow(pw_run *r, pw_rctx_ready_fn ready, void *arg) {
  double spin_until = 0;
  for (;;) {
    if (atomic_load(&r->sh.abort)) return PW_ECANCELED;
    if (ready(arg)) return 0;
    refresh(r);
    int rc = drain_all(r);
    if (rc < 0) return rc;
    if (rc > 0) {
      spin_until = 0;
      continue;
    }
    if (r->snap.due) { /* idle time: the snapshot costs no step anything here */
      pw_snaprun_idle(&r->snap);
      continue;
    }
    double now = pw_now();
    if (spin_until == 0) spin_until = now + (r->cp.io.spin > 0 && !loop_writing(r) ? r->cp.io.spin : 0);
    if (now < spin_until) {
      sched_yield();
      continue;
    }
    struct pollfd fds[MAX_POLL + 1];
    nfds_t n = 0;
    fds[n++] = (struct pollfd){.fd = r->sh.wake_fd, .events = POLLIN};
    for (int k = 0; k < r->cx.n_ranks && n <= MAX_POLL; k++)
      if (r->cp.io.in[k].fd >= 0) fds[n++] = (struct pollfd){.fd = r->cp.io.in[k].fd, .events = POLLIN};
    r->cp.io.sleeps++;
    if (poll(fds, n, -1) > 0 && fds[0].revents & POLLIN) {
      uint64_t drained;
      if (read(r->sh.wake_fd, &drained, sizeof drained) < 0) drained = 0;
    }
    spin_until = 0;
  }
}

/* Counts the time it blocks in cp.waited (the trace's "waiting for a
 * frame"); ready at once, it reads no clock. */
int pw_exec_wait(pw_run *r, pw_rctx_ready_fn ready, void *arg) {
  if (atomic_load(&r->sh.abort)) return PW_ECANCELED;
  if (ready(arg)) return 0;
  double t0 = pw_now();
  int rc = wait_slow(r, ready, arg);
  r->cp.io.waited += pw_now() - t0;
  return rc;
}

void pw_exec_wake(pw_run *r) {
  uint64_t one = 1;
  if (write(r->sh.wake_fd, &one, sizeof one) < 0) { /* the counter is full: it is awake anyway */
  }
}

/* ---- events and failure ---------------------------------------------------- */

/* The ring grows during the first steps only; it always keeps room for the
 * last two events (DONE or FAIL, then EXIT), so those cannot fail. */
int pw_exec_post(pw_run *r, const pw_event *ev) {
  uv_mutex_lock(&r->sh.mu);
  int last = ev->kind == PW_EV_DONE || ev->kind == PW_EV_FAIL || ev->kind == PW_EV_EXIT;
  if (r->sh.ev.len + (last ? 1 : 3) > r->sh.ev.cap) {
    int cap = r->sh.ev.cap ? 2 * r->sh.ev.cap : 64;
    pw_event *q = malloc(sizeof *q * (size_t)cap);
    if (!q) {
      uv_mutex_unlock(&r->sh.mu);
      return PW_ENOMEM;
    }
    for (int i = 0; i < r->sh.ev.len; i++) q[i] = r->sh.ev.q[(r->sh.ev.head + i) % r->sh.ev.cap];
    free(r->sh.ev.q);
    r->sh.ev.q = q;
    r->sh.ev.head = 0;
    r->sh.ev.cap = cap;
  }
  r->sh.ev.q[(r->sh.ev.head + r->sh.ev.len++) % r->sh.ev.cap] = *ev;
  uv_mutex_unlock(&r->sh.mu);
  uv_async_send(&r->lp.async); /* the one call another thread may make on the loop's handle */
  return 0;
}

int pw_exec_fail(pw_run *r, int rc, const pw_err *err, const char *fmt, ...) {
  char msg[256] = "", eb[512] = ""; /* eb: a fetch error names a URL and two hashes */
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (err) pw_err_str(err, eb, sizeof eb);
  uv_mutex_lock(&r->sh.mu);
  if (!r->sh.why.error[0]) snprintf(r->sh.why.error, sizeof r->sh.why.error, "%s%s%s", msg, msg[0] && eb[0] ? ": " : "", eb);
  uv_mutex_unlock(&r->sh.mu);
  return rc ? rc : PW_EINTERNAL;
}

/* One frame: straight to the socket when the loop has nothing queued on
 * the link (so frames stay in order), without blocking; the rest, if the
 * socket does not take it all, goes to the loop, and then the slot is held
 * until that write is done. */
static int send_frame(pw_run *r, int to, const pw_frame_hdr *h, const void *payload, int li, int slot,
                      atomic_int *pending) {
  pw_event ev = {.kind = PW_EV_SEND, .to = to, .li = li, .slot = slot, .payload = payload, .len = h->payload_len,
                 .pending = pending};
  pw_frame_hdr_encode(h, payload, ev.hdr);
  uint64_t total = PW_FRAME_HDR_SIZE + h->payload_len;
  uv_mutex_lock(&r->sh.out.mu);
  int fd = r->sh.out.link[to].fd;
  if (fd < 0) { /* the run is ending: its links are the loop's again */
    uv_mutex_unlock(&r->sh.out.mu);
    return PW_ECANCELED;
  }
  if (r->sh.out.link[to].queued == 0) {
    struct iovec iov[2] = {{ev.hdr, PW_FRAME_HDR_SIZE}, {(void *)payload, h->payload_len}};
    struct msghdr mh = {.msg_iov = iov, .msg_iovlen = h->payload_len ? 2 : 1};
    ssize_t n = sendmsg(fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      int e = errno;
      uv_mutex_unlock(&r->sh.out.mu);
      return pw_exec_fail(r, PW_EPEER, NULL, "send to rank %d: %s", to, strerror(e));
    }
    ev.off = n > 0 ? (uint64_t)n : 0;
  }
  if (ev.off == total) {
    uv_mutex_unlock(&r->sh.out.mu);
    return 0;
  }
  r->sh.out.link[to].queued++;
  uv_mutex_unlock(&r->sh.out.mu);
  if (li >= 0) {
    uv_mutex_lock(&r->sh.mu);
    r->sh.ls[li].slot_sends[slot]++;
    uv_mutex_unlock(&r->sh.mu);
  }
  if (pending) atomic_fetch_add(pending, 1); /* the loop's write (or its drop) gives it back */
  int rc = pw_exec_post(r, &ev);
  if (rc && pending) atomic_fetch_sub(pending, 1);
  return rc ? pw_exec_fail(r, rc, NULL, "out of memory queueing a frame") : 0;
}

/* A tensor over the chunk limit goes as consecutive chunk frames, each
 * sent as a frame is: once one is left to the loop, the later ones queue
 * behind it, so they reach the link in order with nothing between them
 * (only this thread sends on a run's link). */
static int send_chunked(pw_run *r, int to, const pw_frame_hdr *h, const void *payload, int li, int slot,
                        atomic_int *pending) {
  if (h->payload_len <= r->cp.io.chunk_limit) return send_frame(r, to, h, payload, li, slot, pending);
  pw_frame_hdr c;
  for (uint64_t off = 0; off < h->payload_len; off += c.payload_len) {
    int rc = pw_frame_chunk(h, r->cp.io.chunk_limit, off, &c);
    if (rc) {
      char hs[200];
      return pw_exec_fail(r, rc, NULL, "cannot send %s to rank %d in chunks of %zu bytes: %s",
                          pw_frame_hdr_str(h, hs, sizeof hs), to, r->cp.io.chunk_limit, pw_strerror(rc));
    }
    if ((rc = send_frame(r, to, &c, (const uint8_t *)payload + off, li, slot, pending))) return rc;
    r->cp.io.chunks++;
  }
  r->cp.io.chunked++;
  return 0;
}

int pw_exec_send(pw_run *r, int to, const pw_frame_hdr *h, const void *payload, int li, int slot,
                 atomic_int *pending) {
  return send_chunked(r, to, h, payload, li, slot, pending);
}

/* The chunk limit: PW_FRAME_CHUNK_DEFAULT, or PW_WIRE_CHUNK bytes. That
 * variable is for tests: a small limit sends every larger tensor through
 * the chunked path, so a run can prove it equal to an unchunked one. */
int pw_exec_chunk_limit(pw_run *r) {
  const char *s = getenv("PW_WIRE_CHUNK");
  r->cp.io.chunk_limit = PW_FRAME_CHUNK_DEFAULT;
  if (!s || !*s) return 0;
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || *end || v == 0 || v > PW_FRAME_MAX_PAYLOAD || s[0] == '-')
    return pw_exec_fail(r, PW_EINVAL, NULL, "PW_WIRE_CHUNK '%s' is not a byte count in 1..%u", s,
                        PW_FRAME_MAX_PAYLOAD);
  r->cp.io.chunk_limit = (size_t)v;
  return 0;
}


/* ---- the run's context: what its subsystems may ask of it -------------------------- */

static int cx_send(void *run, int to, const pw_frame_hdr *h, const void *payload, atomic_int *pending) {
  return pw_exec_send(run, to, h, payload, -1, -1, pending);
}

static int cx_wait(void *run, pw_rctx_ready_fn ready, void *arg) { return pw_exec_wait(run, ready, arg); }

static int cx_fail(void *run, int rc, const pw_err *err, const char *msg) {
  return pw_exec_fail(run, rc, err, "%s", msg);
}

static int cx_post(void *run, const pw_event *ev) { return pw_exec_post(run, ev); }

static void cx_wake(void *run) { pw_exec_wake(run); }

static int cx_same_host(void *run, int a, int b) { return pw_exec_same_host(run, a, b); }

void pw_exec_bind(pw_run *r) {
  r->cx.run = r;
  r->cx.send = cx_send, r->cx.wait = cx_wait, r->cx.fail_run = cx_fail, r->cx.post = cx_post;
  r->cx.wake = cx_wake, r->cx.same_host = cx_same_host;
}

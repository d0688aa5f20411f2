/* recv: the compute thread reads its inbound links itself.
 *
 * Once a peer's HELLO is admitted (net.c, on the loop thread), the socket
 * belongs to the run's compute thread: whenever it waits for an input it
 * reads every link without blocking, each frame straight into the slot its
 * header names (run.c decides where), so a frame reaches the action that
 * needs it without waking another thread. It spins a little on the sockets
 * before it sleeps in poll() (when its rank has a core of its own), and
 * takes a due snapshot (snaprun.c) in the first wait that would idle. While
 * it computes, the kernel's socket buffers hold what arrives, and a sender
 * whose socket is full lets its loop thread write the rest. */
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "worker.h"

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
  return pw_exec_fail(r, PW_EPEER, NULL, "lost peer rank %d (%s): %s", k, r->peer_addr[k], why);
}

/* The link itself broke (no BYE): the peer's process or host is gone, and
 * the coordinator is told which rank, so it can fence that worker. */
static int lost_link(pw_run *r, int k, const char *why) {
  uv_mutex_lock(&r->sh.mu);
  if (r->sh.lost_rank < 0) r->sh.lost_rank = k;
  uv_mutex_unlock(&r->sh.mu);
  return lost(r, k, why);
}

/* Reads what link k has, without blocking, up to the end of the first
 * frame it completes: the waiter then looks whether its input is in
 * before reading on (a peer's snapshot behind an activation is read in a
 * later wait, not before the action the activation starts). Returns the
 * frames completed (0 or 1) or a negative code with r->sh.error set. */
static int drain(pw_run *r, int k) {
  pw_inlink *in = &r->cp.in[k];
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
      if (pw_run_frame_dest(r, k, &ev.hdr, &dst, &err)) return lost(r, k, pw_err_str(&err, b, sizeof b));
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
          if (r->sh.aborted_rank < 0 && r->sh.lost_rank < 0) r->sh.aborted_rank = k;
          uv_mutex_unlock(&r->sh.mu);
          return pw_exec_fail(r, PW_EPEER, NULL, "peer rank %d aborted: %s", k, why);
        }
        in->bye = 1;
        continue;
      }
      if (pw_run_frame_done(r, k, &ev.hdr, ev.payload, &err)) return lost(r, k, pw_err_str(&err, b, sizeof b));
      return 1;
    }
  }
  return 0;
}

/* Links the loop admitted since we last looked. */
static void refresh(pw_run *r) {
  uv_mutex_lock(&r->sh.mu);
  for (int k = 0; k < r->n_ranks; k++)
    if (r->sh.in_fd[k] >= 0 && r->cp.in[k].fd < 0 && !r->cp.in[k].bye) {
      r->cp.in[k].fd = r->sh.in_fd[k];
      pw_frame_reader_free(&r->cp.in[k].rd);
      pw_frame_reader_init(&r->cp.in[k].rd, MAX_PAYLOAD);
    }
  uv_mutex_unlock(&r->sh.mu);
}

static int drain_all(pw_run *r) {
  int done = 0;
  for (int k = 0; k < r->n_ranks; k++) {
    int rc = drain(r, k);
    if (rc < 0) return rc;
    done += rc;
  }
  return done;
}

int pw_exec_same_host(const pw_run *r, int a, int b) {
  return !strcmp(r->peer_host[a], r->peer_host[b]);
}

void pw_exec_spin_init(pw_run *r) {
  int local = 0;
  for (int k = 0; k < r->n_ranks; k++) local += pw_exec_same_host(r, r->rank, k);
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) cpus = CPU_COUNT(&set);
  long threads = (long)local * (r->w ? r->w->threads : 1);
  r->cp.spin = cpus > 0 && threads > cpus ? 0 : SPIN_SECONDS;
}

/* Frames our loop thread is still writing (a snapshot's, a large
 * tensor's): it needs a core for them, and a spinning compute thread would
 * take this one while a peer computes on the other. */
static int loop_writing(pw_run *r) {
  int n = 0;
  uv_mutex_lock(&r->sh.wmu);
  for (int k = 0; k < r->n_ranks && !n; k++) n = r->sh.wl[k].queued;
  uv_mutex_unlock(&r->sh.wmu);
  return n > 0;
}

static int wait_slow(pw_run *r, int (*ready)(pw_run *, const void *), const void *arg) {
  double spin_until = 0;
  for (;;) {
    if (atomic_load(&r->sh.abort)) return PW_ECANCELED;
    if (ready(r, arg)) return 0;
    refresh(r);
    int rc = drain_all(r);
    if (rc < 0) return rc;
    if (rc > 0) {
      spin_until = 0;
      continue;
    }
    if (r->cp.snap_due) { /* idle time: the snapshot costs no step anything here */
      pw_snaprun_idle(r);
      continue;
    }
    double now = pw_now();
    if (spin_until == 0) spin_until = now + (r->cp.spin > 0 && !loop_writing(r) ? r->cp.spin : 0);
    if (now < spin_until) {
      sched_yield();
      continue;
    }
    struct pollfd fds[MAX_POLL + 1];
    nfds_t n = 0;
    fds[n++] = (struct pollfd){.fd = r->sh.wake_fd, .events = POLLIN};
    for (int k = 0; k < r->n_ranks && n <= MAX_POLL; k++)
      if (r->cp.in[k].fd >= 0) fds[n++] = (struct pollfd){.fd = r->cp.in[k].fd, .events = POLLIN};
    r->cp.sleeps++;
    if (poll(fds, n, -1) > 0 && fds[0].revents & POLLIN) {
      uint64_t drained;
      if (read(r->sh.wake_fd, &drained, sizeof drained) < 0) drained = 0;
    }
    spin_until = 0;
  }
}

/* Counts the time it blocks in cp.waited (the trace's "waiting for a
 * frame"); ready at once, it reads no clock. */
int pw_exec_wait(pw_run *r, int (*ready)(pw_run *, const void *), const void *arg) {
  if (atomic_load(&r->sh.abort)) return PW_ECANCELED;
  if (ready(r, arg)) return 0;
  double t0 = pw_now();
  int rc = wait_slow(r, ready, arg);
  r->cp.waited += pw_now() - t0;
  return rc;
}

void pw_exec_wake(pw_run *r) {
  uint64_t one = 1;
  if (write(r->sh.wake_fd, &one, sizeof one) < 0) { /* the counter is full: it is awake anyway */
  }
}

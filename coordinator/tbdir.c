/* tbdir: the event files of --tensorboard-dir (tbdir.h). The loop keeps
 * which runs' files are due and hands each write to libuv's thread pool;
 * a worker thread reads the store (its own connection), writes a
 * temporary file and renames it over the run's file. It never writes a
 * file in place and never lets two writes of one run overlap. */
#include "tbdir.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "tfevents.h"

#define THROTTLE_MS 1000 /* a run's file at most once a second while it runs, */
#define BYTES_PER_S (1 << 20) /* and a large one no faster than this: each write is the whole file */
#define RETRY_MS 10000   /* after a failed write */
#define GIVE_UP 3         /* failed writes after which an ended run's file is given up */

/* A run whose file is kept. */
typedef struct tb_run {
  int64_t job, run;
  int due;          /* rows were recorded since its last write began */
  int busy;         /* a write is under way */
  int ended;        /* the run ended: forgotten once its last write is done */
  int failed;       /* writes that failed in a row */
  uint64_t next_ms; /* no write starts before (uv_now) */
  struct tb_run *next;
} tb_run;

typedef struct {
  pw_coord *c;
  char dir[3072]; /* room left in a PATH_MAX for job-<id>/<file name> */
  tb_run *runs;
} tbdir;

/* One write, from the loop to a pool thread and back. */
typedef struct {
  uv_work_t req;
  tbdir *tb;
  tb_run *r;
  int rc, skipped; /* skipped: the run has no rows yet (no file) */
  size_t bytes;    /* the file's size */
  pw_err err;
  char path[PATH_MAX];
} tb_write;

int pw_tbdir_open(pw_coord *c, const char *dir, pw_err *err) {
  if (mkdir(dir, 0755) && errno != EEXIST)
    return pw_err_set(err, PW_EIO, "--tensorboard-dir", "cannot create %s: %s", dir, strerror(errno));
  struct stat st;
  if (stat(dir, &st) || !S_ISDIR(st.st_mode))
    return pw_err_set(err, PW_EIO, "--tensorboard-dir", "%s is not a directory", dir);
  if (access(dir, W_OK | X_OK))
    return pw_err_set(err, PW_EIO, "--tensorboard-dir", "cannot write in %s: %s", dir, strerror(errno));
  char real[PATH_MAX];
  if (!realpath(dir, real)) snprintf(real, sizeof real, "%s", dir);
  if (strlen(real) >= sizeof ((tbdir *)0)->dir)
    return pw_err_set(err, PW_EINVAL, "--tensorboard-dir", "%s is too long a path", real);
  tbdir *tb = calloc(1, sizeof *tb);
  if (!tb) return pw_err_set(err, PW_ENOMEM, "--tensorboard-dir", "out of memory");
  memcpy(tb->dir, real, strlen(real) + 1);
  tb->c = c;
  c->tbdir = tb;
  pw_info("tensorboard: each run's event file in %s/job-<id>/", tb->dir);
  return 0;
}

static tb_run *run_of(tbdir *tb, int64_t job, int64_t run) {
  for (tb_run *r = tb->runs; r; r = r->next)
    if (r->job == job && r->run == run) return r;
  tb_run *r = calloc(1, sizeof *r);
  if (!r) {
    pw_error("tensorboard: job %lld run %lld: out of memory; its event file is not kept", (long long)job,
             (long long)run);
    return NULL;
  }
  r->job = job, r->run = run;
  r->next = tb->runs;
  tb->runs = r;
  return r;
}

static void forget(tbdir *tb, tb_run *r) {
  for (tb_run **p = &tb->runs; *p; p = &(*p)->next)
    if (*p == r) {
      *p = r->next;
      free(r);
      return;
    }
}

/* All of buf to fd. */
static int write_all(int fd, const uint8_t *buf, size_t n) {
  while (n) {
    ssize_t k = write(fd, buf, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return -1;
    buf += k, n -= (size_t)k;
  }
  return 0;
}

/* On a pool thread: the run's file from the store, written whole. */
static void write_work(uv_work_t *req) {
  tb_write *w = req->data;
  pw_coord *c = w->tb->c;
  pw_store *s = pw_coord_store(c);
  if (!s) {
    w->rc = pw_err_set(&w->err, PW_EIO, "store", "cannot open the store %s", c->db_path);
    return;
  }
  pw_tf_buf b = {0};
  double created = 0;
  if ((w->rc = pw_store_tfevents(s, w->r->job, w->r->run, &b, &created, &w->err))) return;
  pw_tf_reader rd; /* the version record alone: the run has no rows yet, and no file */
  pw_tf_event ev;
  pw_tf_reader_init(&rd, b.data, b.len, "");
  w->skipped = pw_tf_read(&rd, &ev, NULL) == 1 && pw_tf_read(&rd, &ev, NULL) == 0;
  pw_tf_reader_free(&rd);
  w->bytes = b.len;
  char folder[3200], tmp[3300];
  snprintf(folder, sizeof folder, "%s/job-%lld", w->tb->dir, (long long)w->r->job);
  snprintf(w->path, sizeof w->path, "%s/events.out.tfevents.%lld.pipewright.%010lld", folder, (long long)created,
           (long long)w->r->run);
  snprintf(tmp, sizeof tmp, "%s/.pipewright-%lld.tmp", folder, (long long)w->r->run);
  if (w->skipped) goto done;
  if (mkdir(folder, 0755) && errno != EEXIST) {
    w->rc = pw_err_set(&w->err, PW_EIO, folder, "cannot create it: %s", strerror(errno));
    goto done;
  }
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    w->rc = pw_err_set(&w->err, PW_EIO, tmp, "cannot create it: %s", strerror(errno));
    goto done;
  }
  /* fsync before the rename: after a crash of the machine the name holds
   * the old bytes or the new ones, never an empty file */
  int bad = write_all(fd, b.data, b.len) || fsync(fd);
  int e = errno;
  if (close(fd) && !bad) bad = 1, e = errno;
  if (!bad && rename(tmp, w->path)) bad = 1, e = errno;
  if (bad) {
    unlink(tmp);
    w->rc = pw_err_set(&w->err, e == ENOSPC ? PW_ENOSPC : PW_EIO, w->path, "cannot write it: %s", strerror(e));
  }
done:
  pw_tf_buf_free(&b);
}

static void start_write(tbdir *tb, tb_run *r);

/* Back on the loop: counted, logged when it failed, and the next one. */
static void write_done(uv_work_t *req, int status) {
  tb_write *w = req->data;
  tbdir *tb = w->tb;
  tb_run *r = w->r;
  pw_coord *c = tb->c;
  r->busy = 0;
  if (status) w->rc = pw_err_set(&w->err, PW_EINTERNAL, "tensorboard", "the write was cancelled (%s)", uv_strerror(status));
  if (w->rc) {
    char b[600];
    pthread_mutex_lock(&c->mu);
    c->tb_failures++;
    pthread_mutex_unlock(&c->mu);
    r->failed++;
    int give_up = r->ended && r->failed >= GIVE_UP;
    pw_warn("tensorboard: job %lld run %lld: the event file was not written (%s): %s", (long long)r->job,
            (long long)r->run, give_up ? "given up: the run has ended" : "tried again in 10 s",
            pw_err_str(&w->err, b, sizeof b));
    r->due = !give_up;
    r->next_ms = uv_now(c->loop) + RETRY_MS;
  } else if (!w->skipped) {
    r->failed = 0;
    uint64_t pace = uv_now(c->loop) + (uint64_t)w->bytes * 1000 / BYTES_PER_S;
    if (pace > r->next_ms) r->next_ms = pace;
    pthread_mutex_lock(&c->mu);
    c->tb_writes++;
    pthread_mutex_unlock(&c->mu);
    pw_debug("tensorboard: wrote %s", w->path);
  }
  int failed = w->rc != 0;
  free(w);
  if (!r->ended) return;
  if (!r->due) forget(tb, r);
  else if (!failed) start_write(tb, r); /* it ended while this one ran: its last write, unpaced */
  /* else a failed write of an ended run: the tick tries it again */
}

static void start_write(tbdir *tb, tb_run *r) {
  tb_write *w = calloc(1, sizeof *w);
  if (!w) {
    pw_error("tensorboard: job %lld run %lld: out of memory for a write", (long long)r->job, (long long)r->run);
    return;
  }
  w->tb = tb, w->r = r;
  w->req.data = w;
  r->busy = 1;
  r->due = 0;
  r->next_ms = uv_now(tb->c->loop) + THROTTLE_MS;
  int rc = uv_queue_work(tb->c->loop, &w->req, write_work, write_done);
  if (rc) {
    r->busy = 0;
    r->due = 1;
    pw_warn("tensorboard: job %lld run %lld: cannot start a write: %s", (long long)r->job, (long long)r->run,
            uv_strerror(rc));
    free(w);
  }
}

void pw_tbdir_step(pw_coord *c, int64_t job, int64_t run) {
  tbdir *tb = c->tbdir;
  tb_run *r = tb && run > 0 ? run_of(tb, job, run) : NULL;
  if (r) r->due = 1;
}

void pw_tbdir_end(pw_coord *c, int64_t job, int64_t run) {
  tbdir *tb = c->tbdir;
  tb_run *r = tb && run > 0 ? run_of(tb, job, run) : NULL;
  if (!r) return;
  r->due = 1;
  r->ended = 1;
  r->next_ms = 0;
  if (!r->busy) start_write(tb, r);
}

void pw_tbdir_tick(pw_coord *c, int store_pending) {
  tbdir *tb = c->tbdir;
  if (!tb || store_pending) return;
  uint64_t now = uv_now(c->loop);
  for (tb_run *r = tb->runs; r; r = r->next)
    if (r->due && !r->busy && now >= r->next_ms) start_write(tb, r);
}

void pw_tbdir_close(pw_coord *c) {
  tbdir *tb = c->tbdir;
  if (!tb) return;
  while (tb->runs) {
    tb_run *r = tb->runs;
    if (r->due)
      pw_warn("tensorboard: job %lld run %lld: its event file lacks the last steps (the coordinator stopped first)",
              (long long)r->job, (long long)r->run);
    tb->runs = r->next;
    free(r);
  }
  free(tb);
  c->tbdir = NULL;
}

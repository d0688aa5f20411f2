/* test_worker_fetch: the worker's dataset cache (worker/fetch.c) against a
 * real HTTP server (libmicrohttpd on 127.0.0.1, an ephemeral port) that
 * serves /v1/datasets/<id>/content as the coordinator does.
 *
 * A fetched entry holds the bytes and is served from disk afterwards (the
 * server sees one request); the least recently used entry goes first when
 * room is needed, and the order survives a restart; an entry held by a run
 * is never evicted (when only held ones remain, the error says so); a
 * corrupted entry is found when opened, fetched again once and opened; a
 * body that does not hash to the id, one over the stated size or over the
 * cache, a 401 and a 404 are refused with errors naming the URL (and both
 * hashes), and leave nothing behind. And a run (worker/run.c) whose slice
 * names data.dataset opens it from the cache: fetched on first use, the
 * copy verified by the data loader, a corrupted copy fetched again; its
 * errors name the dataset and the URL; the run holds its entry until freed. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <fcntl.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fetch.h"
#include "sha256.h"
#include "test_worker_fixture.h"

/* ---- the server ------------------------------------------------------------ */

enum { SERVE_OK, SERVE_WRONG, SERVE_CHUNKED };

typedef struct {
  char id[65];
  uint8_t *bytes;
  size_t len;
  int mode;                /* SERVE_WRONG: other bytes than the id's */
  atomic_int hits;
} served;

#define MAX_SERVED 8
static struct {
  struct MHD_Daemon *d;
  char url[64];
  const char *token;       /* required bearer token, or NULL */
  served s[MAX_SERVED];
  int n;
} srv;

static served *lookup(const char *url) {
  for (int i = 0; i < srv.n; i++) {
    char want[128];
    snprintf(want, sizeof want, "/v1/datasets/%s/content", srv.s[i].id);
    if (!strcmp(url, want)) return &srv.s[i];
  }
  return NULL;
}

static enum MHD_Result reply_json(struct MHD_Connection *c, unsigned status, const char *code, const char *msg) {
  char body[256];
  snprintf(body, sizeof body, "{\"error\":{\"code\":\"%s\",\"message\":\"%s\",\"path\":\"\"}}", code, msg);
  struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_COPY);
  enum MHD_Result rc = MHD_queue_response(c, status, r);
  MHD_destroy_response(r);
  return rc;
}

static ssize_t chunk_reader(void *cls, uint64_t pos, char *buf, size_t max) {
  served *s = cls;
  if (pos >= s->len) return MHD_CONTENT_READER_END_OF_STREAM;
  size_t k = s->len - pos < max ? s->len - pos : max;
  memcpy(buf, s->bytes + pos, k);
  return (ssize_t)k;
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                               const char *version, const char *up, size_t *up_size, void **con_cls) {
  if (strcmp(method, "GET")) return reply_json(c, 405, "method_not_allowed", "GET only");
  if (srv.token) {
    const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    char want[300];
    snprintf(want, sizeof want, "Bearer %s", srv.token);
    if (!auth || strcmp(auth, want)) return reply_json(c, 401, "unauthorized", "missing or wrong token");
  }
  served *s = lookup(url);
  if (!s) return reply_json(c, 404, "not_found", "no such dataset");
  atomic_fetch_add(&s->hits, 1);
  struct MHD_Response *r;
  if (s->mode == SERVE_CHUNKED)
    r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, chunk_reader, s, NULL);
  else
    r = MHD_create_response_from_buffer(s->len, s->bytes, MHD_RESPMEM_PERSISTENT);
  enum MHD_Result rc = MHD_queue_response(c, 200, r);
  MHD_destroy_response(r);
  return rc;
}

/* A dataset of n bytes drawn from `seed`, served under its own id (or,
 * SERVE_WRONG, under the id of other bytes). */
static served *serve(size_t n, int seed, int mode) {
  assert_true(srv.n < MAX_SERVED);
  served *s = &srv.s[srv.n++];
  s->bytes = malloc(n ? n : 1);
  assert_non_null(s->bytes);
  for (size_t i = 0; i < n; i++) s->bytes[i] = (uint8_t)(i * 31 + (size_t)seed * 7 + (i >> 8));
  s->len = n;
  s->mode = mode;
  atomic_store(&s->hits, 0);
  pw_sha256_hex(s->bytes, n, s->id);
  if (mode == SERVE_WRONG && n) s->bytes[n / 2] ^= 0x40; /* after hashing */
  return s;
}

static int server_start(void **state) {
  memset(&srv, 0, sizeof srv);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = 0, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  srv.d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG, 0, NULL, NULL, handler, NULL,
                           MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa, MHD_OPTION_END);
  if (!srv.d) return -1;
  const union MHD_DaemonInfo *di = MHD_get_daemon_info(srv.d, MHD_DAEMON_INFO_BIND_PORT);
  if (!di || !di->port) return -1;
  snprintf(srv.url, sizeof srv.url, "http://127.0.0.1:%u", (unsigned)di->port);
  return 0;
}

static int server_stop(void **state) {
  MHD_stop_daemon(srv.d);
  for (int i = 0; i < srv.n; i++) free(srv.s[i].bytes);
  memset(&srv, 0, sizeof srv);
  return 0;
}

/* ---- helpers ----------------------------------------------------------------- */

static char g_dir[256];

static void make_state_dir(void) {
  snprintf(g_dir, sizeof g_dir, "/tmp/pw_fetch_XXXXXX");
  assert_non_null(mkdtemp(g_dir));
}

static void rm_rf(const char *dir) {
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
}

static pw_dscache *open_cache(uint64_t max) {
  pw_dscache *c = NULL;
  pw_err err = {0};
  assert_int_equal(pw_dscache_open(g_dir, max, &c, &err), 0);
  return c;
}

static pw_fetch_src src_of(const served *s) {
  return (pw_fetch_src){.base_url = srv.url, .token = NULL, .size = s ? s->len : 0};
}

static int get(pw_dscache *c, const served *s, pw_err *err) {
  char path[800];
  pw_fetch_src src = src_of(s);
  return pw_dscache_acquire(c, s->id, &src, path, sizeof path, err);
}

/* get + release */
static void touch_entry(pw_dscache *c, const served *s) {
  pw_err err = {0};
  assert_int_equal(get(c, s, &err), 0);
  pw_dscache_release(c, s->id);
}

static void entry_file(const char *id, char *path, size_t cap) {
  snprintf(path, cap, "%s/cache/datasets/%s", g_dir, id);
}

static int file_exists(const char *id) {
  char path[512];
  entry_file(id, path, sizeof path);
  return access(path, F_OK) == 0;
}

static int file_equals(const served *s) {
  char path[512];
  entry_file(s->id, path, sizeof path);
  FILE *f = fopen(path, "rb");
  if (!f) return 0;
  uint8_t *buf = malloc(s->len + 1);
  size_t n = fread(buf, 1, s->len + 1, f);
  fclose(f);
  int eq = n == s->len && !memcmp(buf, s->bytes, n);
  free(buf);
  return eq;
}

/* Files in the cache directory that are not entries (temporary files). */
static int stray_files(void) {
  char dir[400];
  snprintf(dir, sizeof dir, "%s/cache/datasets", g_dir);
  DIR *d = opendir(dir);
  assert_non_null(d);
  int n = 0;
  for (struct dirent *e; (e = readdir(d));)
    if (e->d_name[0] == '.' && strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
  closedir(d);
  return n;
}

static void assert_contains(const char *s, const char *part) {
  if (!strstr(s, part)) fail_msg("'%s' does not contain '%s'", s, part);
}

/* ---- tests ------------------------------------------------------------------- */

static void test_fetch_then_cached(void **state) {
  make_state_dir();
  served *a = serve(1000, 1, SERVE_OK);
  pw_dscache *c = open_cache(1 << 20);
  pw_err err = {0};
  char path[800], want[512];
  pw_fetch_src src = src_of(a);
  src.size = 0; /* no stated size: bounded by the cache */
  assert_int_equal(pw_dscache_acquire(c, a->id, &src, path, sizeof path, &err), 0);
  entry_file(a->id, want, sizeof want);
  assert_string_equal(path, want);
  assert_true(file_equals(a));
  assert_int_equal(atomic_load(&a->hits), 1);
  /* the second use reads the disk, not the network */
  assert_int_equal(pw_dscache_acquire(c, a->id, &src, path, sizeof path, &err), 0);
  assert_int_equal(atomic_load(&a->hits), 1);
  pw_dscache_release(c, a->id);
  pw_dscache_release(c, a->id);
  assert_int_equal(pw_dscache_bytes(c), 1000);
  assert_int_equal(stray_files(), 0);
  pw_dscache_close(c);
  /* a restart finds it */
  c = open_cache(1 << 20);
  assert_int_equal(pw_dscache_count(c), 1);
  assert_true(pw_dscache_has(c, a->id));
  touch_entry(c, a);
  assert_int_equal(atomic_load(&a->hits), 1);
  /* an empty dataset is a dataset too */
  served *e = serve(0, 9, SERVE_OK);
  touch_entry(c, e);
  assert_true(file_equals(e));
  pw_dscache_close(c);
  rm_rf(g_dir);
}

static void test_lru_order(void **state) {
  make_state_dir();
  served *a = serve(100, 1, SERVE_OK), *b = serve(100, 2, SERVE_OK), *cc = serve(100, 3, SERVE_OK),
         *d = serve(100, 4, SERVE_OK), *e = serve(100, 5, SERVE_OK);
  pw_dscache *c = open_cache(300);
  touch_entry(c, a);
  touch_entry(c, b);
  touch_entry(c, cc);
  touch_entry(c, a); /* a used again: b is now the least recently used */
  assert_int_equal(atomic_load(&a->hits), 1);
  touch_entry(c, d);
  assert_false(pw_dscache_has(c, b->id));
  assert_false(file_exists(b->id));
  assert_true(file_exists(a->id) && file_exists(cc->id) && file_exists(d->id));
  assert_int_equal(pw_dscache_bytes(c), 300);
  pw_dscache_close(c);
  /* the order survives a restart (use order: c, a, d) */
  c = open_cache(300);
  assert_int_equal(pw_dscache_count(c), 3);
  touch_entry(c, e);
  assert_false(file_exists(cc->id));
  assert_true(file_exists(a->id) && file_exists(d->id) && file_exists(e->id));
  /* a smaller bound at start-up evicts down to it, oldest first */
  pw_dscache_close(c);
  c = open_cache(200);
  assert_int_equal(pw_dscache_count(c), 2);
  assert_false(file_exists(a->id));
  assert_true(file_exists(d->id) && file_exists(e->id));
  pw_dscache_close(c);
  rm_rf(g_dir);
}

static void test_held_not_evicted(void **state) {
  make_state_dir();
  served *a = serve(100, 1, SERVE_OK), *b = serve(100, 2, SERVE_OK), *cc = serve(100, 3, SERVE_OK),
         *d = serve(100, 4, SERVE_OK), *big = serve(201, 5, SERVE_OK);
  pw_dscache *c = open_cache(200);
  pw_err err = {0};
  assert_int_equal(get(c, a, &err), 0); /* held by a "run" */
  touch_entry(c, b);
  touch_entry(c, cc); /* a is the oldest, but held: b goes */
  assert_true(pw_dscache_has(c, a->id));
  assert_false(pw_dscache_has(c, b->id));
  assert_true(pw_dscache_has(c, cc->id));
  assert_int_equal(get(c, cc, &err), 0);
  /* everything held: no room, and the error says why */
  assert_int_equal(get(c, d, &err), PW_ETOOBIG);
  assert_contains(err.msg, d->id);
  assert_contains(err.msg, "running jobs hold 200 bytes");
  assert_int_equal(atomic_load(&d->hits), 0); /* refused before the request (its size was stated) */
  assert_true(file_exists(a->id) && file_exists(cc->id));
  /* larger than the whole cache */
  assert_int_equal(get(c, big, &err), PW_ETOOBIG);
  assert_contains(err.msg, "--cache-max 200");
  /* once released, a is the one to go */
  pw_dscache_release(c, a->id);
  assert_int_equal(get(c, d, &err), 0);
  assert_false(file_exists(a->id));
  assert_true(file_exists(cc->id) && file_equals(d));
  pw_dscache_release(c, d->id);
  pw_dscache_release(c, cc->id);
  assert_int_equal(stray_files(), 0);
  pw_dscache_close(c);
  rm_rf(g_dir);
}

/* A reader of a dataset file, as the data loader is: it takes the file
 * only when its bytes are the dataset's. */
typedef struct {
  const served *s;
  int calls;
  int refuse;              /* refuse for a reason of content, whatever the bytes */
} reader;

static int read_dataset(void *arg, const char *path, pw_err *err) {
  reader *rd = arg;
  rd->calls++;
  if (rd->refuse) return pw_err_set(err, PW_ESPEC, "data.kind", "refused by the reader");
  return pw_dscache_verify(path, rd->s->id, err);
}

static void corrupt(const served *s) {
  char path[512];
  entry_file(s->id, path, sizeof path);
  int fd = open(path, O_WRONLY);
  assert_true(fd >= 0);
  assert_int_equal(pwrite(fd, "\xff\xfe", 2, 10), 2);
  assert_int_equal(close(fd), 0);
}

static void test_corrupted_refetched(void **state) {
  make_state_dir();
  served *a = serve(5000, 1, SERVE_OK);
  pw_dscache *c = open_cache(1 << 20);
  pw_err err = {0};
  pw_fetch_src src = src_of(a);
  reader rd = {.s = a};
  assert_int_equal(pw_dscache_open_entry(c, a->id, &src, read_dataset, &rd, &err), 0);
  assert_int_equal(rd.calls, 1);
  pw_dscache_release(c, a->id);
  corrupt(a);
  assert_false(file_equals(a));
  /* found when read, fetched again, read again */
  rd.calls = 0;
  assert_int_equal(pw_dscache_open_entry(c, a->id, &src, read_dataset, &rd, &err), 0);
  assert_int_equal(rd.calls, 2);
  assert_int_equal(atomic_load(&a->hits), 2);
  assert_true(file_equals(a));
  assert_int_equal(pw_dscache_bytes(c), 5000);
  pw_dscache_release(c, a->id);
  /* a file deleted under the cache heals the same way */
  char path[512];
  entry_file(a->id, path, sizeof path);
  assert_int_equal(unlink(path), 0);
  assert_int_equal(pw_dscache_open_entry(c, a->id, &src, read_dataset, &rd, &err), 0);
  assert_int_equal(atomic_load(&a->hits), 3);
  pw_dscache_release(c, a->id);
  /* a refusal for the content's sake stands: nothing is fetched again */
  rd.refuse = 1;
  assert_int_equal(pw_dscache_open_entry(c, a->id, &src, read_dataset, &rd, &err), PW_ESPEC);
  assert_int_equal(atomic_load(&a->hits), 3);
  /* ... and the entry is not held afterwards: a smaller bound may evict it */
  served *b = serve(1 << 20, 2, SERVE_OK);
  touch_entry(c, b);
  assert_false(pw_dscache_has(c, a->id));
  pw_dscache_close(c);
  rm_rf(g_dir);
}

static void test_wrong_bytes_refused(void **state) {
  make_state_dir();
  served *w = serve(3000, 1, SERVE_WRONG);
  pw_dscache *c = open_cache(1 << 20);
  pw_err err = {0};
  assert_int_equal(get(c, w, &err), PW_EIO);
  char hex[65];
  pw_sha256_hex(w->bytes, w->len, hex);
  assert_contains(err.msg, hex); /* what came */
  assert_contains(err.msg, w->id); /* what was expected */
  assert_contains(err.msg, srv.url);
  assert_false(pw_dscache_has(c, w->id));
  assert_false(file_exists(w->id));
  assert_int_equal(stray_files(), 0);
  assert_int_equal(pw_dscache_bytes(c), 0);
  /* a corrupted entry whose refetch brings wrong bytes fails the open,
   * leaving nothing held or on disk */
  served *a = serve(3000, 2, SERVE_OK);
  pw_fetch_src src = src_of(a);
  reader rd = {.s = a};
  assert_int_equal(pw_dscache_open_entry(c, a->id, &src, read_dataset, &rd, &err), 0);
  pw_dscache_release(c, a->id);
  corrupt(a);
  a->bytes[7] ^= 1; /* the server goes bad too */
  assert_int_equal(pw_dscache_open_entry(c, a->id, &src, read_dataset, &rd, &err), PW_EIO);
  assert_contains(err.msg, "expected");
  assert_false(pw_dscache_has(c, a->id));
  assert_false(file_exists(a->id));
  assert_int_equal(pw_dscache_count(c), 0);
  assert_int_equal(stray_files(), 0);
  pw_dscache_close(c);
  rm_rf(g_dir);
}

static void test_oversize_refused(void **state) {
  make_state_dir();
  served *a = serve(2000, 1, SERVE_OK), *ch = serve(5000, 2, SERVE_CHUNKED);
  pw_dscache *c = open_cache(4096);
  pw_err err = {0};
  char path[800];
  /* over the size the job states (the server announces its length) */
  pw_fetch_src src = src_of(a);
  src.size = 1000;
  assert_int_equal(pw_dscache_acquire(c, a->id, &src, path, sizeof path, &err), PW_ETOOBIG);
  assert_contains(err.msg, "1000 bytes");
  assert_contains(err.msg, "the size the job states");
  /* no stated size, no length announced (chunked): bounded by the cache */
  src = src_of(ch);
  src.size = 0;
  assert_int_equal(pw_dscache_acquire(c, ch->id, &src, path, sizeof path, &err), PW_ETOOBIG);
  assert_contains(err.msg, "--cache-max");
  assert_contains(err.msg, ch->id);
  /* shorter than stated */
  src = src_of(a);
  src.size = 3000;
  assert_int_equal(pw_dscache_acquire(c, a->id, &src, path, sizeof path, &err), PW_EIO);
  assert_contains(err.msg, "2000 bytes, but the job states 3000");
  assert_int_equal(pw_dscache_count(c), 0);
  assert_int_equal(stray_files(), 0);
  /* a chunked body within the bound is fine */
  served *ok = serve(3000, 3, SERVE_CHUNKED);
  src = src_of(ok);
  src.size = 0;
  assert_int_equal(pw_dscache_acquire(c, ok->id, &src, path, sizeof path, &err), 0);
  assert_true(file_equals(ok));
  pw_dscache_release(c, ok->id);
  pw_dscache_close(c);
  rm_rf(g_dir);
}

static void test_http_errors(void **state) {
  make_state_dir();
  served *a = serve(100, 1, SERVE_OK);
  pw_dscache *c = open_cache(1 << 20);
  pw_err err = {0};
  char path[800];
  pw_fetch_src src = src_of(a);
  srv.token = "s3cret";
  assert_int_equal(pw_dscache_acquire(c, a->id, &src, path, sizeof path, &err), PW_EAUTH);
  assert_contains(err.msg, "HTTP 401");
  assert_contains(err.msg, srv.url);
  assert_contains(err.msg, a->id);
  assert_contains(err.msg, "missing or wrong token"); /* the server's own message */
  assert_contains(err.msg, "no cluster token");
  src.token = "wrong";
  assert_int_equal(pw_dscache_acquire(c, a->id, &src, path, sizeof path, &err), PW_EAUTH);
  assert_contains(err.msg, "refuses this worker's cluster token");
  src.token = "s3cret";
  assert_int_equal(pw_dscache_acquire(c, a->id, &src, path, sizeof path, &err), 0);
  pw_dscache_release(c, a->id);
  srv.token = NULL;
  /* unknown dataset */
  const char *unknown = "00000000000000000000000000000000000000000000000000000000000000ff";
  assert_int_equal(pw_dscache_acquire(c, unknown, &src, path, sizeof path, &err), PW_ENOENT);
  assert_contains(err.msg, "HTTP 404");
  assert_contains(err.msg, unknown);
  /* no URL from the coordinator */
  pw_fetch_src none = {.base_url = NULL};
  assert_int_equal(pw_dscache_acquire(c, unknown, &none, path, sizeof path, &err), PW_EPROTO);
  assert_contains(err.msg, "no http_url");
  assert_contains(err.msg, unknown);
  /* not an id */
  assert_int_equal(pw_dscache_acquire(c, "../../etc/passwd", &src, path, sizeof path, &err), PW_EINVAL);
  assert_int_equal(pw_dscache_acquire(c, "ABCDEF", &src, path, sizeof path, &err), PW_EINVAL);
  /* nobody listening */
  served *b = serve(100, 2, SERVE_OK);
  pw_fetch_src down = src_of(b);
  down.base_url = "http://127.0.0.1:1";
  assert_int_equal(pw_dscache_acquire(c, b->id, &down, path, sizeof path, &err), PW_EPEER);
  assert_contains(err.msg, "http://127.0.0.1:1/v1/datasets/");
  /* a cancelled run's fetch stops */
  atomic_int abort_flag = 1;
  pw_fetch_src cancelled = src_of(b);
  cancelled.abort = &abort_flag;
  assert_int_equal(pw_dscache_acquire(c, b->id, &cancelled, path, sizeof path, &err), PW_ECANCELED);
  assert_int_equal(pw_dscache_count(c), 1);
  assert_int_equal(stray_files(), 0);
  pw_dscache_close(c);
  rm_rf(g_dir);
}

/* A write that fails (a full disk; here the file size limit, which fails
 * writes the same way) fails the fetch naming the URL and the reason, and
 * leaves no temporary file. */
static void test_write_error(void **state) {
  make_state_dir();
  served *a = serve(200000, 1, SERVE_OK);
  pw_dscache *c = open_cache(1 << 20);
  struct rlimit old, lim;
  assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
  lim = old;
  lim.rlim_cur = 65536;
  void (*prev)(int) = signal(SIGXFSZ, SIG_IGN); /* EFBIG instead of the signal */
  assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
  pw_err err = {0};
  int rc = get(c, a, &err);
  assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
  signal(SIGXFSZ, prev);
  assert_int_equal(rc, PW_EIO);
  assert_contains(err.msg, srv.url);
  assert_contains(err.msg, a->id);
  assert_contains(err.msg, "writing");
  assert_contains(err.msg, "File too large");
  assert_false(pw_dscache_has(c, a->id));
  assert_int_equal(stray_files(), 0);
  /* and once there is room again, it works */
  assert_int_equal(get(c, a, &err), 0);
  pw_dscache_release(c, a->id);
  assert_true(file_equals(a));
  pw_dscache_close(c);
  rm_rf(g_dir);
}

static void test_startup_cleans_and_parses(void **state) {
  make_state_dir();
  char dir[400], p[600];
  snprintf(dir, sizeof dir, "%s/cache", g_dir);
  assert_int_equal(mkdir(dir, 0700), 0);
  snprintf(dir, sizeof dir, "%s/cache/datasets", g_dir);
  assert_int_equal(mkdir(dir, 0700), 0);
  snprintf(p, sizeof p, "%s/.fetch-0123456789abcdef-XXXXXX", dir); /* a fetch that was interrupted */
  FILE *f = fopen(p, "w");
  assert_non_null(f);
  fputs("partial", f);
  fclose(f);
  snprintf(p, sizeof p, "%s/notes.txt", dir); /* not an entry: left alone, not counted */
  f = fopen(p, "w");
  assert_non_null(f);
  fputs("hello", f);
  fclose(f);
  pw_dscache *c = open_cache(1 << 20);
  assert_int_equal(stray_files(), 0);
  assert_int_equal(pw_dscache_count(c), 0);
  assert_int_equal(access(p, F_OK), 0);
  pw_dscache_close(c);
  uint64_t v;
  assert_int_equal(pw_parse_bytes("8G", &v), 0);
  assert_true(v == (uint64_t)8 << 30);
  assert_int_equal(pw_parse_bytes("500MiB", &v), 0);
  assert_true(v == (uint64_t)500 << 20);
  assert_int_equal(pw_parse_bytes("1048576", &v), 0);
  assert_true(v == 1048576);
  assert_int_equal(pw_parse_bytes("-1", &v), PW_EINVAL);
  assert_int_equal(pw_parse_bytes("8X", &v), PW_EINVAL);
  assert_int_equal(pw_parse_bytes("", &v), PW_EINVAL);
  assert_int_equal(pw_parse_bytes("99999999999T", &v), PW_EINVAL);
  pw_dscache *bad = NULL;
  pw_err err = {0};
  assert_int_equal(pw_dscache_open(g_dir, 0, &bad, &err), PW_EINVAL);
  rm_rf(g_dir);
}

/* ---- a run's dataset ------------------------------------------------------------ */

/* A text dataset (bytes of prose-like text) served under its id. */
static served *serve_text(size_t n) {
  served *s = serve(n, 0, SERVE_OK);
  for (size_t i = 0; i < n; i++) s->bytes[i] = (uint8_t)("pipelines of stages "[i % 20]);
  pw_sha256_hex(s->bytes, n, s->id);
  return s;
}

static wf_job *dataset_job(const char *id) {
  char spec[1024];
  snprintf(spec, sizeof spec,
           "{\"name\":\"ds\",\"model\":{\"template\":\"gpt\",\"vocab_size\":256,\"seq_len\":8,\"d_model\":8,"
           "\"n_layers\":1,\"n_heads\":2},\"mesh\":{\"pp\":1,\"dp\":1},"
           "\"schedule\":{\"name\":\"gpipe\",\"microbatches\":2},"
           "\"train\":{\"steps\":1,\"batch_size\":4,\"seed\":5},\"data\":{\"kind\":\"text\",\"dataset\":\"%s\"}}",
           id);
  return wf_job_make(spec);
}

/* Rank 0's run opening its files, as its compute thread does: 0 or the
 * error in err. The run is kept (it holds its entry) until run_done. */
static int open_run(wf_job *f, pw_dscache *c, const char *url, pw_run **out, pw_err *err) {
  pw_run *r = wf_run(f, 0, 1);
  r->data.cache = c;
  snprintf(r->cfg.http_url, sizeof r->cfg.http_url, "%s", url);
  r->cfg.token = "";
  *out = r;
  return pw_run_open_files(r, err);
}

static void test_run_dataset(void **state) {
  make_state_dir();
  served *t = serve_text(4000);
  pw_dscache *c = open_cache(1 << 20);
  wf_job *f = dataset_job(t->id);
  pw_err err = {0};
  char b[600];
  pw_run *r;
  /* fetched on first use; the run holds it */
  if (open_run(f, c, srv.url, &r, &err)) fail_msg("%s", pw_err_str(&err, b, sizeof b));
  assert_non_null(r->data.ds);
  assert_int_equal(pw_dataset_train_len(r->data.ds), 3600);
  assert_int_equal(atomic_load(&t->hits), 1);
  assert_true(r->data.held);
  served *other = serve(1 << 20, 7, SERVE_OK); /* as large as the cache: needs t's room */
  assert_int_equal(get(c, other, &err), PW_ETOOBIG);
  assert_contains(err.msg, "running jobs hold 4000 bytes");
  wf_run_free(f, r);
  /* a corrupted copy: the data loader refuses it, it is fetched again */
  corrupt(t);
  if (open_run(f, c, srv.url, &r, &err)) fail_msg("%s", pw_err_str(&err, b, sizeof b));
  assert_int_equal(atomic_load(&t->hits), 2);
  assert_true(file_equals(t));
  assert_non_null(r->data.ds);
  wf_run_free(f, r);
  /* freed runs hold nothing: the next dataset may take the room */
  assert_int_equal(get(c, other, &err), 0);
  pw_dscache_release(c, other->id);
  assert_false(pw_dscache_has(c, t->id));
  /* not cached, and no URL to fetch it from */
  assert_int_equal(open_run(f, c, "", &r, &err), PW_EPROTO);
  assert_contains(err.msg, t->id);
  assert_contains(err.msg, "no http_url");
  assert_false(r->data.held);
  wf_run_free(f, r);
  wf_job_free(f);
  /* a server sending other bytes than the id's */
  served *bad = serve_text(3000);
  char real[65];
  memcpy(real, bad->id, sizeof real);
  bad->id[0] = bad->id[0] == '0' ? '1' : '0'; /* served under an id its bytes do not hash to */
  f = dataset_job(bad->id);
  assert_int_equal(open_run(f, c, srv.url, &r, &err), PW_EIO);
  assert_contains(err.msg, srv.url);
  assert_contains(err.msg, bad->id);
  assert_contains(err.msg, real);
  wf_run_free(f, r);
  wf_job_free(f);
  /* a dataset the coordinator does not have */
  const char *unknown = "00000000000000000000000000000000000000000000000000000000000000ff";
  f = dataset_job(unknown);
  assert_int_equal(open_run(f, c, srv.url, &r, &err), PW_ENOENT);
  assert_contains(err.msg, "HTTP 404");
  assert_contains(err.msg, srv.url);
  assert_contains(err.msg, unknown);
  wf_run_free(f, r);
  wf_job_free(f);
  assert_int_equal(stray_files(), 0);
  pw_dscache_close(c);
  rm_rf(g_dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_fetch_then_cached, server_start, server_stop),
      cmocka_unit_test_setup_teardown(test_lru_order, server_start, server_stop),
      cmocka_unit_test_setup_teardown(test_held_not_evicted, server_start, server_stop),
      cmocka_unit_test_setup_teardown(test_corrupted_refetched, server_start, server_stop),
      cmocka_unit_test_setup_teardown(test_wrong_bytes_refused, server_start, server_stop),
      cmocka_unit_test_setup_teardown(test_oversize_refused, server_start, server_stop),
      cmocka_unit_test_setup_teardown(test_http_errors, server_start, server_stop),
      cmocka_unit_test_setup_teardown(test_write_error, server_start, server_stop),
      cmocka_unit_test(test_startup_cleans_and_parses),
      cmocka_unit_test_setup_teardown(test_run_dataset, server_start, server_stop),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

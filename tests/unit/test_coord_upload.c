/* test_coord_upload: streamed request bodies (PW_ROUTE_STREAM) through the
 * real HTTP server into the dataset store: chunked and sized uploads land
 * whole with their sha256; a token file's ids are checked across piece
 * boundaries; a body over --max-upload, a refused one and one cut off
 * leave no temporary file; the content route takes the cluster token and
 * nothing else does; the welcome message's http_url. */
#include <dirent.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "httptest.h"

#include "coord.h"
#include "ctl_int.h"
#include "sha256.h"

static pw_coord C;
static char tmpdir[64];

static void coord_init(pw_coord *c) {
  memset(c, 0, sizeof *c);
  pthread_mutex_init(&c->mu, NULL);
  snprintf(c->http_host, sizeof c->http_host, "127.0.0.1");
  snprintf(c->db_path, sizeof c->db_path, "%s/coord.db", tmpdir);
  snprintf(c->state_dir, sizeof c->state_dir, "%s", tmpdir);
  snprintf(c->api_token, sizeof c->api_token, "api");
  snprintf(c->cluster_token, sizeof c->cluster_token, "cluster");
  c->max_body = 64 * 1024;
  c->max_upload = 1 << 20;
  /* libmicrohttpd sometimes notices a client gone mid-body only at the idle
   * timeout: keep it short, so "however the request ends" ends soon */
  c->http_idle_timeout = 2;
  pw_err err = {0};
  assert_int_equal(pw_http_start(c, &err), 0);
}

static int setup(void **state) {
  snprintf(tmpdir, sizeof tmpdir, "/tmp/pw-upload-XXXXXX");
  if (!mkdtemp(tmpdir)) return -1;
  coord_init(&C);
  return 0;
}

static int teardown(void **state) {
  pw_http_stop(&C);
  for (int i = 0; i < C.n_stores; i++) pw_store_close(C.stores[i]);
  free(C.stores);
  pthread_mutex_destroy(&C.mu);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
  return system(cmd);
}

static int uploads_left(void) {
  char d[128];
  snprintf(d, sizeof d, "%s/datasets", tmpdir);
  DIR *dir = opendir(d);
  if (!dir) return 0;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(dir))) n += !strncmp(e->d_name, ".upload-", 8);
  closedir(dir);
  return n;
}

/* POST /v1/datasets with body in chunked pieces of `piece` bytes. */
static void upload_chunked(const unsigned char *body, size_t n, size_t piece, resp *out) {
  size_t cap = n + n / (piece ? piece : 1) * 16 + 512, len = 0;
  char *q = malloc(cap);
  len += (size_t)snprintf(q, cap, "POST /v1/datasets?name=chunks HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                                  "Authorization: Bearer api\r\nTransfer-Encoding: chunked\r\n\r\n");
  for (size_t off = 0; off < n; off += piece) {
    size_t k = n - off < piece ? n - off : piece;
    len += (size_t)snprintf(q + len, cap - len, "%zx\r\n", k);
    memcpy(q + len, body + off, k);
    len += k;
    len += (size_t)snprintf(q + len, cap - len, "\r\n");
  }
  len += (size_t)snprintf(q + len, cap - len, "0\r\n\r\n");
  ht_exchange(ht_dial(C.http_port, 0), q, len, out);
  free(q);
}

static void test_chunked_and_sized(void **state) {
  size_t n = 300 * 1000 + 7;
  unsigned char *body = malloc(n);
  for (size_t i = 0; i < n; i++) body[i] = (unsigned char)(i * 2654435761u >> 13);
  char hex[65];
  pw_sha256_hex(body, n, hex);
  resp r;
  upload_chunked(body, n, 4099, &r);
  if (r.status != 201) fprintf(stderr, "%d %s\n", r.status, r.body);
  assert_int_equal(r.status, 201);
  json_t *j = body_json(&r);
  assert_string_equal(json_string_value(json_object_get(j, "id")), hex);
  assert_int_equal(json_integer_value(json_object_get(j, "size")), (json_int_t)n);
  assert_string_equal(json_string_value(json_object_get(j, "format")), "text");
  json_decref(j);
  resp_free(&r);
  /* the stored file holds exactly the bytes */
  char path[256];
  snprintf(path, sizeof path, "%s/datasets/%s", tmpdir, hex);
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  unsigned char *back = malloc(n + 1);
  assert_int_equal(fread(back, 1, n + 1, f), n);
  fclose(f);
  assert_memory_equal(back, body, n);
  free(back);
  /* the same bytes with a Content-Length: 200, same id */
  char hdr[128];
  snprintf(hdr, sizeof hdr, "Authorization: Bearer api\r\nContent-Length: %zu\r\n", n);
  int fd = ht_dial(C.http_port, 0);
  char head[512];
  int hl = snprintf(head, sizeof head, "POST /v1/datasets HTTP/1.1\r\nHost: x\r\nConnection: close\r\n%s\r\n", hdr);
  ht_send_raw(fd, head, (size_t)hl);
  ht_send_raw(fd, (const char *)body, n);
  ht_read(fd, &r);
  assert_int_equal(r.status, 200);
  j = body_json(&r);
  assert_string_equal(json_string_value(json_object_get(j, "id")), hex);
  assert_string_equal(json_string_value(json_object_get(j, "name")), "chunks"); /* the first name stays */
  json_decref(j);
  resp_free(&r);
  assert_int_equal(uploads_left(), 0);
  free(body);
}

/* A token file whose bad id straddles two pieces is caught. */
static void test_token_ids_across_pieces(void **state) {
  enum { N = 5000 };
  size_t n = 32 + 2 * N;
  unsigned char *b = calloc(1, n);
  memcpy(b, "PWTOKENS", 8);
  uint32_t hdr[4] = {1, 2, 300, 0};
  memcpy(b + 8, hdr, 16);
  uint64_t nt = N;
  memcpy(b + 24, &nt, 8);
  for (int i = 0; i < N; i++) {
    uint16_t v = (uint16_t)(i % 300);
    memcpy(b + 32 + 2 * i, &v, 2);
  }
  resp r;
  upload_chunked(b, n, 333, &r); /* odd pieces: ids cut in two */
  assert_int_equal(r.status, 201);
  json_t *j = body_json(&r);
  assert_string_equal(json_string_value(json_object_get(j, "format")), "tokens");
  assert_int_equal(json_integer_value(json_object_get(j, "vocab_size")), 300);
  assert_int_equal(json_integer_value(json_object_get(j, "n_tokens")), N);
  json_decref(j);
  resp_free(&r);
  /* id 150 (bytes 332..333, across the first piece's end) over the vocabulary */
  uint16_t bad = 400;
  memcpy(b + 32 + 2 * 150, &bad, 2);
  upload_chunked(b, n, 333, &r);
  check_error(&r, 400, "malformed_data", "body", "token 150 is 400");
  resp_free(&r);
  /* a size that is not the header's */
  upload_chunked(b, n - 1, 333, &r);
  check_error(&r, 400, "malformed_data", "body", "");
  resp_free(&r);
  assert_int_equal(uploads_left(), 0);
  free(b);
}

static void test_over_the_bound_and_cut_off(void **state) {
  size_t n = (1 << 20) + 1;
  unsigned char *b = calloc(1, n);
  resp r;
  upload_chunked(b, n, 65536, &r);
  check_error(&r, 413, "too_large", "body", "limit of 1048576");
  resp_free(&r);
  assert_int_equal(uploads_left(), 0);
  /* declared over the bound: refused before a byte is read */
  ht_req(C.http_port, 0, "POST", "/v1/datasets", "Authorization: Bearer api\r\nContent-Length: 2000000\r\n", NULL, &r);
  check_error(&r, 413, "too_large", "body", "limit is 1048576");
  resp_free(&r);
  /* cut off: the server ends the request and its file goes */
  int fd = ht_dial(C.http_port, 0);
  const char *h = "POST /v1/datasets HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer api\r\nContent-Length: 500000\r\n\r\n";
  ht_send_raw(fd, h, strlen(h));
  ht_send_raw(fd, (const char *)b, 100000);
  for (int i = 0; i < 200 && uploads_left() == 0; i++) usleep(10000); /* the upload has started */
  assert_int_equal(uploads_left(), 1);
  close(fd);
  for (int i = 0; i < 3000 && uploads_left() > 0; i++) usleep(10000); /* a condition, bounded: never a timing claim */
  assert_int_equal(uploads_left(), 0);
  /* a bad name is refused before the body */
  ht_req(C.http_port, 0, "POST", "/v1/datasets?name=%01", "Authorization: Bearer api\r\n", "x", &r);
  check_error(&r, 400, "invalid_argument", "name", "printable");
  resp_free(&r);
  free(b);
}

static void test_cluster_token(void **state) {
  resp r;
  ht_req(C.http_port, 0, "POST", "/v1/datasets", "Authorization: Bearer api\r\n", "tokens test bytes", &r);
  assert_true(r.status == 201 || r.status == 200);
  json_t *j = body_json(&r);
  char url[160];
  snprintf(url, sizeof url, "/v1/datasets/%s/content", json_string_value(json_object_get(j, "id")));
  json_decref(j);
  resp_free(&r);
  ht_req(C.http_port, 0, "GET", url, "Authorization: Bearer cluster\r\n", NULL, &r);
  assert_int_equal(r.status, 200);
  assert_int_equal(r.len, strlen("tokens test bytes"));
  assert_memory_equal(r.body, "tokens test bytes", r.len);
  resp_free(&r);
  ht_req(C.http_port, 0, "GET", url, "Authorization: Bearer nope\r\n", NULL, &r);
  check_error(&r, 401, "unauthorized", "Authorization", "");
  resp_free(&r);
  ht_req(C.http_port, 0, "GET", "/v1/datasets", "Authorization: Bearer cluster\r\n", NULL, &r);
  check_error(&r, 401, "unauthorized", "Authorization", "");
  resp_free(&r);
  ht_req(C.http_port, 0, "POST", "/v1/datasets", "Authorization: Bearer cluster\r\n", "x", &r);
  check_error(&r, 401, "unauthorized", "Authorization", "");
  resp_free(&r);
}

static void test_http_url(void **state) {
  pw_coord c;
  memset(&c, 0, sizeof c);
  char out[300];
  c.http_port = 8080;
  snprintf(c.http_host, sizeof c.http_host, "10.1.2.3");
  pw_ctl_http_url(&c, NULL, out, sizeof out);
  assert_string_equal(out, "http://10.1.2.3:8080");
  snprintf(c.http_host, sizeof c.http_host, "[fd00::1]");
  pw_ctl_http_url(&c, NULL, out, sizeof out);
  assert_string_equal(out, "http://[fd00::1]:8080");
  snprintf(c.http_host, sizeof c.http_host, "0.0.0.0");
  pw_ctl_http_url(&c, NULL, out, sizeof out);
  assert_string_equal(out, ""); /* nothing to go by */
  struct sockaddr_in a = {.sin_family = AF_INET};
  inet_pton(AF_INET, "192.168.7.9", &a.sin_addr);
  pw_ctl_http_url(&c, (struct sockaddr *)&a, out, sizeof out);
  assert_string_equal(out, "http://192.168.7.9:8080");
  snprintf(c.advertise_url, sizeof c.advertise_url, "https://coord.example:443");
  pw_ctl_http_url(&c, (struct sockaddr *)&a, out, sizeof out);
  assert_string_equal(out, "https://coord.example:443");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_chunked_and_sized),
      cmocka_unit_test(test_token_ids_across_pieces),
      cmocka_unit_test(test_over_the_bound_and_cut_off),
      cmocka_unit_test(test_cluster_token),
      cmocka_unit_test(test_http_url),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}

/* cmd_dataset: `pipewright dataset upload | list | rm | convert | check`.
 *
 * A dataset is a file the coordinator stores under the sha256 of its
 * bytes (api/openapi.yaml, /v1/datasets). upload streams the file from
 * disk (never whole in memory), and only when the coordinator does not
 * already hold those bytes; convert and check work on local files only
 * (common/io/tokfile.h). Exit codes: 0 success, 1 an error, 2 bad usage. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "args.h"
#include "cli.h"
#include "suggest.h"
#include "remote.h"
#include "sha256.h"
#include "tokfile.h"

#define CHUNK ((size_t)1 << 20)
#define PROGRESS_MIN ((unsigned long long)16 << 20) /* smaller uploads show no progress */

/* ---- local files ------------------------------------------------------------------ */

/* Opens a regular file for reading; prints why not. */
static int open_regular(const char *path, int *fd, unsigned long long *size) {
  *fd = open(path, O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (*fd < 0 || fstat(*fd, &st) != 0) {
    fprintf(stderr, "error: %s: %s\n", path, strerror(errno));
    if (*fd >= 0) close(*fd);
    return 1;
  }
  if (!S_ISREG(st.st_mode)) {
    fprintf(stderr, "error: %s: not a regular file\n", path);
    close(*fd);
    return 1;
  }
  *size = (unsigned long long)st.st_size;
  return 0;
}

static long long read_some(int fd, void *buf, size_t cap) {
  for (;;) {
    ssize_t k = read(fd, buf, cap);
    if (k >= 0) return k;
    if (errno != EINTR) return -errno;
  }
}

/* The sha256 of the file's first size bytes, as lowercase hex. */
static int hash_fd(const char *path, int fd, unsigned long long size, char hex[65]) {
  char *buf = malloc(CHUNK);
  if (!buf) {
    fprintf(stderr, "error: out of memory\n");
    return 1;
  }
  pw_sha256_ctx c;
  pw_sha256_init(&c);
  unsigned long long done = 0;
  while (done < size) {
    long long k = read_some(fd, buf, size - done < CHUNK ? (size_t)(size - done) : CHUNK);
    if (k <= 0) {
      fprintf(stderr, "error: %s: %s\n", path,
              k < 0 ? strerror((int)-k) : "the file shrank while it was read");
      free(buf);
      return 1;
    }
    pw_sha256_update(&c, buf, (size_t)k);
    done += (unsigned long long)k;
  }
  free(buf);
  uint8_t d[PW_SHA256_LEN];
  pw_sha256_final(&c, d);
  pw_sha256_to_hex(d, hex);
  return 0;
}

/* A token file's header (the ids are the coordinator's to check, or
 * `dataset check`'s): a wrong one is refused before anything is sent. */
static int check_header(const char *path, int fd, unsigned long long size) {
  uint8_t h[PW_TOKFILE_HEADER];
  long long k = pread(fd, h, sizeof h, 0);
  if (k < 0) {
    fprintf(stderr, "error: %s: %s\n", path, strerror(errno));
    return 1;
  }
  if (!pw_tokfile_is_tokens(h, (size_t)k)) return 0;
  pw_tokfile_hdr hdr;
  pw_err err = {0};
  if (pw_tokfile_header_parse(h, (size_t)k, size, &hdr, path, &err)) {
    pw_cli_report(&err);
    return 1;
  }
  return 0;
}

/* ---- the upload's body ---------------------------------------------------------------- */

typedef struct {
  int fd;
  const char *path;
  unsigned long long size, done;
  pw_sha256_ctx sha; /* of the bytes sent */
  int progress;      /* print progress to stderr (a terminal) */
  int last_pct;
} file_src;

static long long read_file(void *ud, char *buf, size_t cap) {
  file_src *f = ud;
  long long k = read_some(f->fd, buf, cap);
  if (k <= 0) return k;
  pw_sha256_update(&f->sha, buf, (size_t)k);
  f->done += (unsigned long long)k;
  if (f->progress) {
    int pct = (int)(f->done * 100 / f->size);
    if (pct != f->last_pct) {
      char a[32], b[32];
      fprintf(stderr, "\ruploading %s: %3d%% (%s of %s bytes)\033[K", f->path, pct,
              pw_cli_si((double)f->done, a, 32), pw_cli_si((double)f->size, b, 32));
      f->last_pct = pct;
    }
  }
  return k;
}

/* Percent-encodes s for a query value (the unreserved characters kept). */
static int query_escape(const char *s, char *out, size_t cap) {
  static const char hexd[] = "0123456789ABCDEF";
  size_t n = 0;
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    int keep = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || strchr("-._~", *p);
    if (n + (keep ? 1 : 3) >= cap) return -1;
    if (keep)
      out[n++] = (char)*p;
    else
      out[n++] = '%', out[n++] = hexd[*p >> 4], out[n++] = hexd[*p & 15];
  }
  out[n] = 0;
  return 0;
}

static int is_hex64(const char *s) {
  return s && strlen(s) == 64 && strspn(s, "0123456789abcdef") == 64;
}

const char *pw_cli_dataset_describe(const json_t *ds, char *buf, int cap) {
  char si[32];
  long long size = pw_jint(ds, "size", -1);
  const char *format = pw_jstr(ds, "format", "?");
  int n = snprintf(buf, (size_t)cap, "%lld bytes (%s), %s", size, pw_cli_si((double)size, si, 32), format);
  if (!strcmp(format, "tokens") && n < cap)
    snprintf(buf + n, (size_t)(cap - n), ": %lld ids of %lld bytes, vocab %lld", pw_jint(ds, "n_tokens", -1),
             pw_jint(ds, "width", -1), pw_jint(ds, "vocab_size", -1));
  return buf;
}

int pw_cli_dataset_put(pw_remote *r, const char *path, const char *name, pw_cli_dataset *out) {
  memset(out, 0, sizeof *out);
  int fd;
  unsigned long long size;
  if (open_regular(path, &fd, &size)) return 1;
  char hex[65], target[900];
  if (check_header(path, fd, size) || hash_fd(path, fd, size, hex)) {
    close(fd);
    return 1;
  }
  /* already there: nothing to send */
  pw_http_resp resp;
  json_t *j;
  snprintf(target, sizeof target, "/v1/datasets/%s", hex);
  int rc = pw_remote_call(r, "GET", target, NULL, 0, PW_CALL_KEEP_API, &resp, &j);
  if (rc == PW_CALL_OK) {
    close(fd);
    pw_http_resp_free(&resp);
    snprintf(out->id, sizeof out->id, "%s", hex);
    out->size = size;
    out->existed = 1;
    out->ds = j;
    return 0;
  }
  if (rc == PW_CALL_NET || resp.status != 404) {
    if (rc == PW_CALL_API) pw_remote_print_error(r, &resp), pw_http_resp_free(&resp);
    close(fd);
    return 1;
  }
  pw_http_resp_free(&resp);

  char esc[768];
  if (!name) name = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
  if (query_escape(name, esc, sizeof esc)) {
    fprintf(stderr, "error: --name: too long (at most 250 bytes)\n");
    close(fd);
    return 1;
  }
  snprintf(target, sizeof target, "/v1/datasets%s%s", *esc ? "?name=" : "", esc);
  file_src f = {.fd = fd, .path = path, .size = size, .last_pct = -1};
  f.progress = size >= PROGRESS_MIN && isatty(STDERR_FILENO);
  pw_sha256_init(&f.sha);
  if (lseek(fd, 0, SEEK_SET) != 0) {
    fprintf(stderr, "error: %s: %s\n", path, strerror(errno));
    close(fd);
    return 1;
  }
  pw_http_body_src src = {.size = size, .content_type = "application/octet-stream", .read = read_file, .ud = &f};
  rc = pw_remote_upload(r, target, &src, 0, &resp, &j);
  if (f.progress) fprintf(stderr, "\n");
  close(fd);
  if (rc) return 1;
  pw_http_resp_free(&resp);
  uint8_t d[PW_SHA256_LEN];
  char sent[65];
  pw_sha256_final(&f.sha, d);
  pw_sha256_to_hex(d, sent);
  const char *id = pw_jstr(j, "id", "");
  if (strcmp(sent, hex)) {
    fprintf(stderr, "error: %s: the file changed while it was uploaded (sha256 %s, then %s)\n", path, hex, sent);
    json_decref(j);
    return 1;
  }
  if (strcmp(id, hex)) {
    fprintf(stderr, "error: the coordinator stored %s as dataset '%.64s', but its bytes hash to %s\n", path, id,
            hex);
    json_decref(j);
    return 1;
  }
  snprintf(out->id, sizeof out->id, "%s", hex);
  out->size = size;
  out->existed = resp.status == 200; /* 201: new; 200: someone stored it meanwhile */
  out->ds = j;
  return 0;
}

/* ---- upload --------------------------------------------------------------------------- */

static void upload_usage(FILE *f) {
  fprintf(f,
          "usage: pipewright dataset upload FILE [options]\n"
          "  stores FILE on the coordinator as a dataset named by the sha256 of its bytes, streamed,\n"
          "  and only when the coordinator does not hold those bytes yet\n"
          "  --name N            a name to show in lists (default: FILE's base name)\n"
          "  --quiet             print only the dataset's id\n"
          "  (--timeout bounds a stall of the upload, not its whole length)\n" PW_REMOTE_USAGE);
}

static int ds_upload(int argc, char **argv) {
  static const struct option opts[] = {
      {"name", required_argument, 0, 'n'}, {"quiet", no_argument, 0, 'q'}, PW_REMOTE_LONG_OPTS, {0, 0, 0, 0}};
  pw_remote_opts co = {0};
  const char *name = NULL;
  int quiet = 0, c;
  optind = 1;
  while ((c = pw_remote_getopt(argc, argv, "n:qh", opts, &co)) != -1) {
    switch (c) {
      case 'n': name = optarg; break;
      case 'q': quiet = 1; break;
      case 'h': upload_usage(stdout); return 0;
      default: upload_usage(stderr); return 2;
    }
  }
  if (pw_args_operands(argc, argv, 1, 1, "FILE")) {
    upload_usage(stderr);
    return 2;
  }
  pw_remote r;
  if (pw_remote_init(&r, &co)) return 1;
  pw_cli_dataset ds;
  if (pw_cli_dataset_put(&r, argv[optind], name, &ds)) return 1;
  if (r.json) {
    char *s = json_dumps(ds.ds, JSON_PRESERVE_ORDER);
    if (s) puts(s);
    free(s);
  } else if (quiet) {
    printf("%s\n", ds.id);
  } else {
    char d[160];
    printf("dataset %s %s: %s\n", ds.id, ds.existed ? "already stored" : "uploaded",
           pw_cli_dataset_describe(ds.ds, d, sizeof d));
    const char *stored = pw_jstr(ds.ds, "name", "");
    if (ds.existed && name && strcmp(stored, name))
      printf("  (stored earlier under the name '%s')\n", stored);
  }
  json_decref(ds.ds);
  return 0;
}

/* ---- list ----------------------------------------------------------------------------- */

static void list_usage(FILE *f) {
  fprintf(f,
          "usage: pipewright dataset list [options]\n"
          "  the coordinator's datasets: id, name, format, size, tokens, when stored\n"
          "  --no-trunc          whole ids (default: their first 12 characters)\n" PW_REMOTE_USAGE);
}

static int ds_list(int argc, char **argv) {
  static const struct option opts[] = {{"no-trunc", no_argument, 0, 'w'}, PW_REMOTE_LONG_OPTS, {0, 0, 0, 0}};
  pw_remote_opts co = {0};
  int wide = 0, c;
  optind = 1;
  while ((c = pw_remote_getopt(argc, argv, "h", opts, &co)) != -1) {
    switch (c) {
      case 'w': wide = 1; break;
      case 'h': list_usage(stdout); return 0;
      default: list_usage(stderr); return 2;
    }
  }
  if (pw_args_operands(argc, argv, 0, 0, NULL)) {
    list_usage(stderr);
    return 2;
  }
  pw_remote r;
  if (pw_remote_init(&r, &co)) return 1;
  pw_http_resp resp;
  json_t *j;
  if (pw_remote_call(&r, "GET", "/v1/datasets", NULL, 0, 0, &resp, &j)) return 1;
  if (r.json) {
    pw_remote_print_raw(&resp);
  } else {
    const json_t *list = json_object_get(j, "datasets"), *ds;
    size_t i;
    int iw = wide ? 64 : 12, nw = 4;
    json_array_foreach(list, i, ds) {
      int n = (int)strlen(pw_jstr(ds, "name", ""));
      if (n > nw) nw = n > 32 ? 32 : n;
    }
    printf("%-*s %-*s %-7s %9s %9s %7s %s\n", iw, "ID", nw, "NAME", "FORMAT", "SIZE", "TOKENS", "VOCAB", "CREATED");
    json_array_foreach(list, i, ds) {
      char sz[32], tok[32] = "-", voc[32] = "-", when[32];
      if (!strcmp(pw_jstr(ds, "format", ""), "tokens")) {
        pw_cli_si((double)pw_jint(ds, "n_tokens", 0), tok, 32);
        snprintf(voc, sizeof voc, "%lld", pw_jint(ds, "vocab_size", 0));
      }
      printf("%-*.*s %-*.*s %-7s %9s %9s %7s %s\n", iw, iw, pw_jstr(ds, "id", "?"), nw, nw, pw_jstr(ds, "name", ""),
             pw_jstr(ds, "format", "?"), pw_cli_si((double)pw_jint(ds, "size", 0), sz, 32), tok, voc,
             pw_cli_fmt_time(pw_jnum(ds, "created"), when, 32));
    }
    if (!json_array_size(list)) printf("(no datasets)\n");
  }
  json_decref(j);
  pw_http_resp_free(&resp);
  return 0;
}

/* ---- rm ------------------------------------------------------------------------------- */

static void rm_usage(FILE *f) {
  fprintf(f,
          "usage: pipewright dataset rm ID [options]\n"
          "  deletes a dataset (refused while a queued or running job uses it); ID is the whole\n"
          "  sha256 or a prefix of it that names one dataset\n" PW_REMOTE_USAGE);
}

/* A whole id for a prefix of one (as `list` shows them). */
static int resolve_id(pw_remote *r, const char *given, char id[65]) {
  size_t n = strlen(given);
  if (n < 4 || n > 64 || strspn(given, "0123456789abcdef") != n) {
    fprintf(stderr, "error: '%s' is not a dataset id (64 lowercase hex characters, or at least 4 of them)\n",
            given);
    return 2;
  }
  if (n == 64) {
    memcpy(id, given, 65);
    return 0;
  }
  pw_http_resp resp;
  json_t *j, *ds;
  if (pw_remote_call(r, "GET", "/v1/datasets", NULL, 0, 0, &resp, &j)) return 1;
  pw_http_resp_free(&resp);
  size_t i, found = 0;
  json_array_foreach(json_object_get(j, "datasets"), i, ds) {
    const char *s = pw_jstr(ds, "id", "");
    if (is_hex64(s) && !strncmp(s, given, n) && found++ == 0) memcpy(id, s, 65);
  }
  json_decref(j);
  if (found == 1) return 0;
  if (found)
    fprintf(stderr, "error: '%s' names %zu datasets: give more of the id\n", given, found);
  else
    fprintf(stderr, "error: no dataset %s... on the coordinator\n", given);
  return 1;
}

static int ds_rm(int argc, char **argv) {
  pw_remote_opts co = {0};
  int rc = pw_remote_parse_only(argc, argv, rm_usage, &co);
  if (rc >= 0) return rc;
  if (pw_args_operands(argc, argv, 1, 1, "the dataset ID")) {
    rm_usage(stderr);
    return 2;
  }
  pw_remote r;
  if (pw_remote_init(&r, &co)) return 1;
  char id[65], target[128];
  if ((rc = resolve_id(&r, argv[optind], id))) return rc;
  snprintf(target, sizeof target, "/v1/datasets/%s", id);
  pw_http_resp resp;
  if (pw_remote_call(&r, "DELETE", target, NULL, 0, 0, &resp, NULL)) return 1;
  if (r.json)
    pw_remote_print_raw(&resp);
  else
    printf("dataset %s removed\n", id);
  pw_http_resp_free(&resp);
  return 0;
}

/* ---- convert, check: local files --------------------------------------------------------- */

static int local_help(int argc, char **argv, const char *text, int nargs) {
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return fputs(text, stdout), 0;
  for (int i = 1; i < argc; i++)
    if (argv[i][0] == '-' && argv[i][1]) {
      pw_cli_usage_error("unknown option '%s'", argv[i]);
      return fputs(text, stderr), 2;
    }
  optind = 1;
  if (pw_args_operands(argc, argv, nargs, nargs, nargs == 1 ? "FILE" : argc == 2 ? "OUT" : "TEXT and OUT"))
    return fputs(text, stderr), 2;
  return -1;
}

static int ds_convert(int argc, char **argv) {
  static const char text[] =
      "usage: pipewright dataset convert TEXT OUT\n"
      "  writes TEXT as a token file OUT, byte-level: each byte one id, vocab 256, 2-byte ids\n"
      "  (OUT is written to a temporary name, fsynced and renamed). With a Hugging Face\n"
      "  tokenizer.json instead: pipewright tokenize --tokenizer FILE --in TEXT --out OUT\n";
  int rc = local_help(argc, argv, text, 2);
  if (rc >= 0) return rc;
  const char *in = argv[1], *out = argv[2];
  int fd;
  unsigned long long size;
  if (open_regular(in, &fd, &size)) return 1;
  uint8_t head[PW_TOKFILE_HEADER];
  long long k = pread(fd, head, sizeof head, 0);
  struct stat a, b;
  int same = fstat(fd, &a) == 0 && stat(out, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
  close(fd);
  if (k < 0) return fprintf(stderr, "error: %s: %s\n", in, strerror(errno)), 1;
  if (pw_tokfile_is_tokens(head, (size_t)k))
    return fprintf(stderr, "error: %s: already a token file (it starts with " PW_TOKFILE_MAGIC ")\n", in), 1;
  if (same) return fprintf(stderr, "error: %s: OUT must not be the input file\n", out), 1;
  pw_tokfile_hdr h;
  pw_err err = {0};
  if (pw_tokfile_from_text(in, out, &h, &err)) {
    pw_cli_report(&err);
    return 1;
  }
  printf("%s: %llu tokens, vocab %u, %u-byte ids (byte-level, from %s)\n", out, (unsigned long long)h.n_tokens,
         h.vocab_size, h.width, in);
  return 0;
}

/* Header, then every id, a chunk at a time (a large file is never whole in memory). */
static int ds_check(int argc, char **argv) {
  static const char text[] =
      "usage: pipewright dataset check FILE\n"
      "  a token file: checks its header, its size and that every id is below its vocab size;\n"
      "  anything else is byte-level text (every byte is a token). Exit 0 when valid, 1 if not.\n";
  int rc = local_help(argc, argv, text, 1);
  if (rc >= 0) return rc;
  const char *path = argv[1];
  int fd;
  unsigned long long size;
  if (open_regular(path, &fd, &size)) return 1;
  uint8_t head[PW_TOKFILE_HEADER];
  long long k = pread(fd, head, sizeof head, 0);
  if (k < 0) {
    fprintf(stderr, "error: %s: %s\n", path, strerror(errno));
    close(fd);
    return 1;
  }
  if (!pw_tokfile_is_tokens(head, (size_t)k)) {
    close(fd);
    char si[32];
    printf("%s: text (byte-level): %llu bytes (%s), each byte one token of vocab 256\n", path, size,
           pw_cli_si((double)size, si, 32));
    return 0;
  }
  pw_tokfile_hdr h;
  pw_err err = {0};
  uint8_t *buf = NULL;
  rc = pw_tokfile_header_parse(head, (size_t)k, size, &h, path, &err);
  if (!rc && !(buf = malloc(CHUNK))) rc = pw_err_set(&err, PW_ENOMEM, path, "out of memory");
  uint64_t first = 0, per = rc ? 0 : CHUNK / h.width; /* h is set only on success */
  while (!rc && first < h.n_tokens) {
    uint64_t n = h.n_tokens - first < per ? h.n_tokens - first : per;
    size_t want = (size_t)(n * h.width), got = 0;
    while (got < want) {
      long long r = pread(fd, buf + got, want - got, (off_t)(PW_TOKFILE_HEADER + first * h.width + got));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        rc = pw_err_set(&err, PW_EIO, path, "%s", r < 0 ? strerror(errno) : "the file shrank while it was read");
        break;
      }
      got += (size_t)r;
    }
    if (!rc) rc = pw_tokfile_check_ids(buf, n, first, &h, path, &err);
    first += n;
  }
  free(buf);
  close(fd);
  if (rc) {
    pw_cli_report(&err);
    return 1;
  }
  printf("%s: tokens: version %u, %llu ids of %u bytes, vocab %u: header and ids valid\n", path, h.version,
         (unsigned long long)h.n_tokens, h.width, h.vocab_size);
  return 0;
}

/* ---- the command ---------------------------------------------------------------------- */

static void usage(FILE *f) {
  fprintf(f,
          "usage: pipewright dataset <command> [options]\n"
          "  upload FILE [--name N]  store a file on the coordinator (named by its sha256)\n"
          "  list                    the coordinator's datasets\n"
          "  rm ID                   delete a dataset no queued or running job uses\n"
          "  convert TEXT OUT        byte-level text -> token file (vocab 256, 2-byte ids)\n"
          "  check FILE              validate a token file's header and ids (or say it is text)\n"
          "'pipewright dataset <command> --help' shows a command's options.\n");
}

int pw_cmd_dataset(int argc, char **argv) {
  static const struct {
    const char *name;
    int (*run)(int, char **);
  } subs[] = {{"upload", ds_upload}, {"list", ds_list}, {"ls", ds_list}, {"rm", ds_rm},
              {"convert", ds_convert}, {"check", ds_check}};
  if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  static char name[32];
  for (size_t i = 0; i < sizeof subs / sizeof subs[0]; i++)
    if (!strcmp(argv[1], subs[i].name)) {
      snprintf(name, sizeof name, "dataset %s", subs[i].name); /* every message names the subcommand */
      pw_cli_cmd_name = name;
      return subs[i].run(argc - 1, argv + 1);
    }
  const char *names[sizeof subs / sizeof subs[0]];
  for (size_t i = 0; i < sizeof subs / sizeof subs[0]; i++) names[i] = subs[i].name;
  char near[160];
  pw_cli_usage_error("unknown command '%s'%s", argv[1],
                     pw_suggest_text(argv[1], names, (int)(sizeof subs / sizeof subs[0]), "", near, sizeof near));
  usage(stderr);
  return 2;
}

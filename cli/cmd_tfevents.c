/* cmd_tfevents: `pipewright tfevents FILE...` — reads TensorBoard event
 * files (common/io/tfevents.h) with every check TensorBoard makes, and
 * prints their events: the scalars of each step, the file version, run
 * (re)starts. A file the coordinator wrote (GET /v1/jobs/ID/events.tfevents,
 * --tensorboard-dir) or any other writer's (PyTorch's SummaryWriter:
 * simple scalars; other kinds of values are counted, not shown). Exit
 * codes: 0 every file is whole records, 1 a file is corrupted, truncated
 * or unreadable (its events before the bad record are printed, then the
 * error naming the record's offset), 2 bad usage. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_short.h"
#include "args.h"
#include "cli.h"
#include "tfevents.h"

static void tfevents_usage(FILE *f) {
  fprintf(f,
          "usage: pipewright tfevents FILE... [--json]\n"
          "  every record of TensorBoard event files, checked (length and data CRC-32C)\n"
          "  --json   one JSON object per event: offset, wall_time, step, and version, start\n"
          "           or scalars {tag: value}\n");
}

/* The whole file, malloc'd (NULL with errno on failure). */
static uint8_t *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  uint8_t *buf = NULL;
  size_t cap = 0;
  *n = 0;
  for (;;) {
    if (*n == cap) {
      cap = cap ? cap * 2 : 1 << 16;
      uint8_t *nb = realloc(buf, cap);
      if (!nb) break;
      buf = nb;
    }
    size_t k = fread(buf + *n, 1, cap - *n, f);
    *n += k;
    if (k == 0) break;
  }
  int bad = ferror(f) || *n == cap, e = errno;
  fclose(f);
  if (bad) {
    free(buf);
    errno = e ? e : ENOMEM;
    return NULL;
  }
  return buf ? buf : malloc(1);
}

static void print_event(const pw_tf_event *ev, int json) {
  if (json) {
    json_t *o = json_pack("{s:I, s:f, s:I}", "offset", (json_int_t)ev->offset, "wall_time", ev->wall_time, "step",
                          (json_int_t)ev->step);
    if (ev->kind == PW_TF_VERSION) json_object_set_new(o, "version", json_string(ev->version));
    if (ev->kind == PW_TF_START) json_object_set_new(o, "start", json_true());
    if (ev->kind == PW_TF_SCALARS) {
      json_t *sc = json_object();
      for (int i = 0; i < ev->n_values; i++) /* a float: exactly its value, as a double */
        json_object_set_new(sc, ev->values[i].tag, json_real((double)ev->values[i].value));
      json_object_set_new(o, "scalars", sc);
      if (ev->n_other) json_object_set_new(o, "other_values", json_integer(ev->n_other));
    }
    char *s = pw_json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (s) puts(s);
    free(s);
    json_decref(o);
    return;
  }
  if (ev->kind == PW_TF_VERSION) {
    printf("file version %s\n", ev->version);
  } else if (ev->kind == PW_TF_START) {
    printf("step %lld: a run starts (TensorBoard drops earlier steps from here on)\n", (long long)ev->step);
  } else if (ev->kind == PW_TF_SCALARS) {
    printf("step %lld:", (long long)ev->step);
    for (int i = 0; i < ev->n_values; i++) printf("  %s %.8g", ev->values[i].tag, ev->values[i].value);
    if (ev->n_other) printf("  (+%d other values)", ev->n_other);
    printf("\n");
  } else {
    printf("step %lld: an event of another kind\n", (long long)ev->step);
  }
}

static int read_file(const char *path, int json) {
  size_t n = 0;
  uint8_t *data = slurp(path, &n);
  if (!data) {
    fprintf(stderr, "pipewright tfevents: %s: %s\n", path, strerror(errno));
    return 1;
  }
  pw_tf_reader r;
  pw_tf_reader_init(&r, data, n, path);
  pw_tf_event ev;
  pw_err err = {0};
  int rc, records = 0;
  while ((rc = pw_tf_read(&r, &ev, &err)) == 1) {
    print_event(&ev, json);
    records++;
  }
  fflush(stdout);
  if (rc < 0) {
    char b[600];
    fprintf(stderr, "pipewright tfevents: %s\n", pw_err_str(&err, b, sizeof b));
  } else if (!json) {
    printf("%s: %d records, %zu bytes, whole\n", path, records, n);
  }
  pw_tf_reader_free(&r);
  free(data);
  return rc < 0;
}

int pw_cmd_tfevents(int argc, char **argv) {
  static const struct option opts[] = {{"json", no_argument, 0, 'j'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
  int json = 0, o;
  optind = 1;
  while ((o = pw_getopt(argc, argv, "", opts)) != -1) {
    if (o == 'j') json = 1;
    else if (o == 'h') return tfevents_usage(stdout), 0;
    else return tfevents_usage(stderr), 2;
  }
  if (pw_args_operands(argc, argv, 1, 1 << 20, "FILE") < 0) return tfevents_usage(stderr), 2;
  int bad = 0;
  for (int i = optind; i < argc; i++) bad |= read_file(argv[i], json);
  return bad;
}

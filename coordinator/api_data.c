/* api_data: a submitted job's data, before it is queued.
 *
 * data.path is a file on the coordinator's host, so it is read only under
 * --data-root (none by default: every path is refused): the path, joined to
 * the root when relative, is resolved (symlinks and "..") and must land
 * inside the root on a regular file the coordinator can read; anything else
 * is a 422 at data.path naming the path and the root. An accepted file is
 * imported into the dataset store (hashed and copied, on the pool thread
 * the submission runs on) and the job reads that dataset: workers on other
 * hosts fetch it by its id, never by a path. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "api.h"
#include "datasets.h"
#include "log.h"

/* Is real (a resolved path) root itself or inside it? */
static int under_root(const char *real, const char *root) {
  size_t n = strlen(root);
  if (n == 1 && root[0] == '/') return 1;
  return !strncmp(real, root, n) && (real[n] == 0 || real[n] == '/');
}

int pw_api_data_check(pw_req *r, const pw_job *job, char *real, size_t cap) {
  const char *given = job->data.path, *root = r->c->data_root;
  real[0] = 0;
  if (job->data.kind != PW_DATA_TEXT || !given[0]) return 0;
  if (!root[0]) {
    pw_reply_error(r, PW_ESPEC, "data.path",
                   "\"%.300s\": this coordinator reads no local files (no --data-root is set): upload the file "
                   "(POST /v1/datasets, pipewright dataset upload) and name it as data.dataset",
                   given);
    return PW_ESPEC;
  }
  char joined[PATH_MAX * 2], res[PATH_MAX];
  snprintf(joined, sizeof joined, given[0] == '/' ? "%s" : "%s/%s", given[0] == '/' ? given : root, given);
  if (!realpath(joined, res)) {
    int e = errno;
    pw_reply_error(r, PW_ESPEC, "data.path", "\"%.300s\": %s under the data root %s", given,
                   e == ENOENT || e == ENOTDIR ? "no such file" : strerror(e), root);
    return PW_ESPEC;
  }
  if (!under_root(res, root)) {
    pw_reply_error(r, PW_ESPEC, "data.path", "\"%.300s\" resolves outside the data root %s", given, root);
    return PW_ESPEC;
  }
  struct stat st;
  if (stat(res, &st) || !S_ISREG(st.st_mode)) {
    pw_reply_error(r, PW_ESPEC, "data.path", "\"%.300s\" is not a regular file (data root %s)", given, root);
    return PW_ESPEC;
  }
  if (access(res, R_OK)) {
    pw_reply_error(r, PW_ESPEC, "data.path", "\"%.300s\" cannot be read: %s (data root %s)", given, strerror(errno),
                   root);
    return PW_ESPEC;
  }
  if (strlen(res) >= cap) {
    pw_reply_error(r, PW_ESPEC, "data.path", "\"%.300s\": the resolved path is too long", given);
    return PW_ESPEC;
  }
  memcpy(real, res, strlen(res) + 1);
  return 0;
}

int pw_api_data_import(pw_req *r, pw_store *s, const char *real, pw_ds_info *info) {
  pw_err err = {0};
  int rc = pw_ds_import(r->c->state_dir, real, "data.path", info, &err);
  if (!rc) {
    pw_dataset_new d = {.id = info->id,
                        .size = info->size,
                        .format = info->format,
                        .name = strrchr(real, '/') ? strrchr(real, '/') + 1 : real,
                        .vocab_size = info->vocab_size,
                        .width = info->width,
                        .n_tokens = info->n_tokens};
    int created = 0;
    rc = pw_store_dataset_insert(s, &d, &created, NULL, &err);
    if (!rc && created)
      pw_info("dataset %s imported from %s: %lld bytes, %s", info->id, real, (long long)info->size, info->format);
  }
  if (rc) {
    char b[600];
    pw_error("submit: importing %s: %s", real, pw_err_str(&err, b, sizeof b));
    pw_reply_err(r, &err);
  }
  return rc;
}

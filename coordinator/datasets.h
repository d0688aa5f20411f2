/* datasets: the coordinator's content-addressed dataset files.
 *
 * A dataset is a file of bytes named by the SHA-256 of those bytes (64
 * lowercase hex digits): <state_dir>/datasets/<id>. Same bytes, same id,
 * one file. A file arrives through a writer: bytes are appended to
 * <state_dir>/datasets/.upload-XXXXXX and hashed as they come (never held
 * whole in memory); commit fsyncs it, detects its format and renames it to
 * its id (replacing a file of the same id, which has the same bytes), then
 * fsyncs the folder. A writer freed without commit removes its file.
 *
 * Formats: "tokens" when the file starts with "PWTOKENS" (a token file,
 * common/io/tokfile.h; its header is read into the info), else "text" (any
 * bytes). This module knows files only; the store keeps the rows
 * (store.h), the API the routes (api_datasets.c). Thread-safe: writers
 * share nothing. */
#ifndef PW_DATASETS_H
#define PW_DATASETS_H

#include <stddef.h>
#include <stdint.h>

#include "errors.h"

#define PW_DS_ID_LEN 64

/* What a committed file is. */
typedef struct {
  char id[PW_DS_ID_LEN + 1]; /* = its sha256 */
  int64_t size;
  char format[8];            /* "text" | "tokens" */
  int64_t vocab_size, width, n_tokens; /* tokens: from the header; else -1 */
} pw_ds_info;

typedef struct pw_ds_writer pw_ds_writer;

/* 1 when s is 64 lowercase hex digits. */
int pw_ds_id_valid(const char *s);
/* <state_dir>/datasets/<id> into out (PW_EINVAL when it does not fit). */
PW_MUST_CHECK int pw_ds_path(const char *state_dir, const char *id, char *out, size_t cap, pw_err *err);

/* A new temporary file in <state_dir>/datasets (the folder is made if
 * missing). */
PW_MUST_CHECK int pw_ds_writer_open(const char *state_dir, pw_ds_writer **out, pw_err *err);
/* The same in <state_dir>/<sub> (weights.c stores its files this way). */
PW_MUST_CHECK int pw_ds_writer_open_in(const char *state_dir, const char *sub, pw_ds_writer **out, pw_err *err);
/* Appends and hashes n bytes. A full disk (or quota) is PW_ENOSPC, any
 * other failure PW_EIO, naming the file. */
PW_MUST_CHECK int pw_ds_writer_write(pw_ds_writer *w, const void *data, size_t n, pw_err *err);
/* fsync, format, rename to the id, fsync the folder; fills info. what
 * names the data in errors (a token header that does not parse is
 * PW_EFORMAT at what). The writer still has to be freed. */
PW_MUST_CHECK int pw_ds_writer_commit(pw_ds_writer *w, const char *what, pw_ds_info *info, pw_err *err);
/* All n bytes to fd (EINTR retried): 0, or the errno (EIO for a write
 * that wrote nothing). */
int pw_ds_write_all(int fd, const void *data, size_t n);
/* A synced temporary file tmp renamed to final in dir (*committed 1 once
 * renamed), then dir synced so the name survives a crash; failures as
 * the writer's, naming the file. Checkpoint shards (checkpoints.c) are
 * published the same way. */
PW_MUST_CHECK int pw_ds_publish(const char *tmp, const char *final, const char *dir, int *committed, pw_err *err);
/* Bytes written so far. */
uint64_t pw_ds_writer_size(const pw_ds_writer *w);
/* The temporary file (until commit), for a caller checking its content
 * before it is committed. */
const char *pw_ds_writer_tmp_path(const pw_ds_writer *w);
/* Closes; removes the temporary file unless committed. NULL is fine. */
void pw_ds_writer_free(pw_ds_writer *w);

/* Copies what the open file fd holds, from where it stands, into the store
 * (streamed: hashed and written piece by piece) and commits it. fd stays
 * the caller's. */
PW_MUST_CHECK int pw_ds_import(const char *state_dir, int fd, const char *what, pw_ds_info *info, pw_err *err);
/* Removes <id>'s file (missing is fine). */
PW_MUST_CHECK int pw_ds_unlink(const char *state_dir, const char *id, pw_err *err);
/* Removes temporary files a crash left in <state_dir>/datasets; returns
 * how many. For start-up, before the API serves. */
int pw_ds_sweep(const char *state_dir);
/* The same in <state_dir>/<sub>. */
int pw_ds_sweep_in(const char *state_dir, const char *sub);
/* Free bytes for an unprivileged writer on the datasets' filesystem, -1 if
 * unknown. */
int64_t pw_ds_free_bytes(const char *state_dir);

#endif

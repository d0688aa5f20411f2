/* api_objects: the REST handlers shared by the two kinds of stored,
 * content-addressed files (id = sha256, 64 hex; a store row; a job link
 * that refuses delete while a live job uses it): datasets
 * (api_datasets.c) and stored weights (api_weights.c). A kind is a const
 * table of its words, URL, store calls and files; each kind's thin entry
 * points (the ones api.c's route table names) pass it in. */
#ifndef PW_API_OBJECTS_H
#define PW_API_OBJECTS_H

#include "api.h"

typedef struct {
  const char *what;    /* log lines: "dataset %s deleted", "dataset upload: ..." */
  const char *missing; /* the 404: "no <missing> <id>" */
  const char *its;     /* the 500 for a file that cannot be served: "<what> <id>: <its> file ..." */
  const char *param;   /* the path parameter errors name: "ds" | "ck" */
  const char *url;     /* the Location prefix: "/v1/datasets/" */
  const char *sub;     /* the folder under the state directory */
  int (*row)(pw_store *s, const char *id, json_t **out, pw_err *err);
  int (*list)(pw_store *s, json_t **out, pw_err *err);
  int (*del)(pw_store *s, const char *id, json_t **out, pw_err *err);
  int (*path)(const char *state_dir, const char *id, char *out, size_t cap, pw_err *err);
  int (*unlink)(const char *state_dir, const char *id, pw_err *err);
} pw_api_kind;

/* The upload in r->stream while a body arrives. */
typedef struct {
  const pw_api_kind *k;
  pw_ds_writer *w;
  char name[129];
} pw_api_upload;

/* The stream sink's parts: begin reads ?name=, checks the room and opens
 * a writer in the kind's folder; chunk writes; done frees. */
PW_MUST_CHECK int pw_api_object_begin(pw_req *r, int64_t declared, const pw_api_kind *k);
int pw_api_object_chunk(pw_req *r, const char *data, size_t n);
void pw_api_object_done(pw_req *r);
/* The upload handler's end: a failure (rc) logged and replied, else the
 * row (201 when created, 200 when the id was there) with its Location. */
void pw_api_object_reply(pw_req *r, const pw_api_kind *k, int rc, const pw_err *err, const char *id, int created,
                         json_t *row);

void pw_api_object_list(pw_req *r, const pw_api_kind *k);
void pw_api_object_get(pw_req *r, const pw_api_kind *k);
void pw_api_object_content(pw_req *r, const pw_api_kind *k);
void pw_api_object_delete(pw_req *r, const pw_api_kind *k);

#endif

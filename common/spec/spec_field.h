/* spec_field: the field tables behind spec.c and spec_model.c (private).
 *
 * Every object of a job spec is described by a table of fields: its JSON
 * key, type, range, default, where in the C struct it lands, and a mask of
 * the variants (template, layer type, optimizer, data kind ...) it belongs
 * to. One parser and one emitter walk these tables, so pw_job_parse and
 * pw_job_to_json cannot drift apart, and each rule is written once.
 * Nothing outside spec*.c includes this file. */
#ifndef PW_SPEC_FIELD_H
#define PW_SPEC_FIELD_H

#include <stddef.h>

#include <jansson.h>

#include "errors.h"
#include "spec_json.h"

typedef enum {
  PW__F_SKIP,  /* allowed key, parsed by the caller (objects, arrays) */
  PW__F_INT,   /* int; JSON integer only */
  PW__F_U64,   /* unsigned long long; JSON integer >= 0 */
  PW__F_NUM,   /* double; any JSON number */
  PW__F_FLOAT, /* float; any JSON number */
  PW__F_BOOL,  /* int 0/1; JSON true/false */
  PW__F_ENUM,  /* int index into names; JSON string */
  PW__F_STR    /* char[cap]; JSON string, non-empty */
} pw__ftype;

enum {
  PW__REQ = 1,      /* absent is an error */
  PW__NODEF = 2,    /* absent: leave the struct alone (the caller fills it) */
  PW__LO_OPEN = 4,  /* value > lo rather than >= lo */
  PW__HI_OPEN = 8,  /* value < hi rather than <= hi */
  PW__OMIT0 = 16,   /* emitter: leave out when the value is 0 (int, bool, enum) */
  PW__OMITDEF = 32  /* emitter: leave out an int equal to its default */
};

#define PW__ALL 0xffffffffu

typedef struct {
  const char *key;
  unsigned char type;       /* pw__ftype */
  unsigned char flags;
  unsigned mask;            /* variants this field belongs to */
  size_t off;               /* offset in the destination struct */
  size_t cap;               /* PW__F_STR: buffer size */
  double def, lo, hi;       /* default and inclusive range (see flags) */
  const char *const *names; /* PW__F_ENUM: names, index = value */
  int n_names;
} pw__field;

#define PW__NOLIM 1e300
#define PW__FLT_MAX 3.4e38

/* Table entries: key, flags, variant mask, struct type and member, then
 * default and range where they apply. */
#define PW__SKIP(k, fl, m) {(k), PW__F_SKIP, (fl), (m), 0, 0, 0, 0, 0, NULL, 0}
#define PW__INT(k, fl, m, T, mem, d, lo, hi) \
  {(k), PW__F_INT, (fl), (m), offsetof(T, mem), 0, (d), (lo), (hi), NULL, 0}
#define PW__U64(k, fl, m, T, mem, d) \
  {(k), PW__F_U64, (fl), (m), offsetof(T, mem), 0, (d), 0, PW__NOLIM, NULL, 0}
#define PW__NUM(k, fl, m, T, mem, d, lo, hi) \
  {(k), PW__F_NUM, (fl), (m), offsetof(T, mem), 0, (d), (lo), (hi), NULL, 0}
#define PW__FLOAT(k, fl, m, T, mem, d, lo, hi) \
  {(k), PW__F_FLOAT, (fl), (m), offsetof(T, mem), 0, (d), (lo), (hi), NULL, 0}
#define PW__BOOL(k, fl, m, T, mem, d) \
  {(k), PW__F_BOOL, (fl), (m), offsetof(T, mem), 0, (d), 0, 1, NULL, 0}
#define PW__ENUM(k, fl, m, T, mem, d, names) \
  {(k), PW__F_ENUM, (fl), (m), offsetof(T, mem), 0, (d), 0, 0, (names), \
   (int)(sizeof(names) / sizeof((names)[0]))}
#define PW__STR(k, fl, m, T, mem) \
  {(k), PW__F_STR, (fl), (m), offsetof(T, mem), sizeof(((T *)0)->mem), 0, 0, 0, NULL, 0}
#define PW__N(tab) ((int)(sizeof(tab) / sizeof((tab)[0])))

/* The engine (spec_field.c). Join a JSON path: "" + "model" -> "model", "model" + "n_heads" -> "model.n_heads". */
void pw__path(char *buf, size_t cap, const char *pre, const char *key);
/* Parse the fields of `o` (NULL = an empty object) that belong to `mask`
 * into dst. A key of another variant is "not used with <ctx>"; a key in no
 * entry is "unknown field". Absent fields get their default. */
PW_MUST_CHECK int pw__fields_parse(const json_t *o, const char *pre, const pw__field *tab, int n, unsigned mask,
                     const char *ctx, void *dst, pw_err *err);
/* One value v (NULL: absent) at path, by the rules of field f, into dst
 * (for values outside any object, e.g. an array's elements). */
PW_MUST_CHECK int pw__field_parse(const pw__field *f, const json_t *v, const char *path, void *dst, pw_err *err);
/* Write the fields of `mask` from src into the object o. */
PW_MUST_CHECK int pw__fields_emit(json_t *o, const pw__field *tab, int n, unsigned mask, const void *src);
/* Read an enum-valued key early (it decides the mask for the rest):
 * def < 0 means required. */
PW_MUST_CHECK int pw__enum_get(const json_t *o, const char *pre, const char *key, const char *const *names, int n,
                 int def, int *out, pw_err *err);
/* A list of glob patterns at `path` (train.trainable, model.lora.targets):
 * an array of 1 to max non-empty strings shorter than len bytes each, into
 * dst (max rows of len chars), *n of them; `what` ends the array's error. */
PW_MUST_CHECK int pw__globs_get(const json_t *a, const char *path, int max, int len, char *dst, int *n,
                                const char *what, pw_err *err);
/* The same list back as a JSON array set as key `key` of o. 0 or -1. */
int pw__globs_emit(json_t *o, const char *key, const char *src, int len, int n);
/* The member `key` of o as an object (NULL when absent); an error if it is
 * present and not an object. */
PW_MUST_CHECK int pw__obj_get(const json_t *o, const char *pre, const char *key, const json_t **out, pw_err *err);

/* The model section (spec_model.c): parse (the path prefix is "model"),
 * the canonical JSON, and release; of a regions model only the fields
 * beside model.regions and model.graph (spec.c adds those). */
PW_MUST_CHECK int pw__model_parse(const json_t *o, pw_model_spec *m, pw_err *err);
json_t *pw__model_emit(const pw_model_spec *m);
void pw__model_free(pw_model_spec *m);

/* Pieces of a layers list shared with model.regions (spec_model.c): one
 * entry, an "input" object ({"kind", "dim"?}), and their canonical JSON
 * (NULL when out of memory); a layer type's name. */
PW_MUST_CHECK int pw__layer_parse(const json_t *e, const char *pre, pw_layer_spec *ls, pw_err *err);
json_t *pw__layer_emit(const pw_layer_spec *ls);
PW_MUST_CHECK int pw__input_parse(const json_t *in, const char *path, int *kind, int *dim, pw_err *err);
json_t *pw__input_emit(int kind, int dim);
const char *pw__layer_type_name(int t);
/* model.regions and model.graph (spec_regions.c): parsed and checked on
 * their own; then, once mesh and schedule have parsed, each region's mesh
 * and schedule against the job's (dp, the ranks, the default schedule). */
PW_MUST_CHECK int pw__regions_parse(const json_t *model, pw_model_spec *m, pw_err *err);
PW_MUST_CHECK int pw__regions_emit(json_t *model, const pw_model_spec *m);
PW_MUST_CHECK int pw__regions_settle(pw_job *job, const json_t *mesh, pw_err *err);

/* The data and init sections (spec_data.c): the data kinds' names (by
 * pw_data_kind), parse (the path prefixes are "data" and "init"; a
 * relative data.path is tried from here, then from base_dir), and the
 * canonical JSON (init: NULL when out of memory). */
extern const char *const pw__data_names[];
PW_MUST_CHECK int pw__data_parse(const json_t *o, const char *base_dir, pw_data_spec *d, pw_err *err);
PW_MUST_CHECK int pw__data_emit(json_t *data, const pw_data_spec *d);
PW_MUST_CHECK int pw__init_parse(const json_t *o, pw_init_spec *in, pw_err *err);
json_t *pw__init_emit(const pw_init_spec *in);

/* Where layers and stages go (spec_layout.c): mesh.placement,
 * partition.stages (mode explicit; `a` NULL when absent), the
 * stage_boundary hints of m copied into p (after p->mode is set: markers
 * mode checks their numbering), and the release of all three. */
PW_MUST_CHECK int pw__placement_parse(const json_t *mesh, pw_mesh_spec *ms, pw_err *err);
PW_MUST_CHECK int pw__placement_emit(json_t *mesh, const pw_mesh_spec *ms);
PW_MUST_CHECK int pw__stages_parse(const json_t *a, pw_partition_spec *p, pw_err *err);
PW_MUST_CHECK int pw__stages_emit(json_t *part, const pw_partition_spec *p);
PW_MUST_CHECK int pw__hints_collect(const pw_model_spec *m, pw_partition_spec *p, pw_err *err);
void pw__layout_free(pw_job *job);

#endif

/* rowmm: the two paths of rowmm.h and the probe that picks one.
 *
 * The oneDNN path keeps one matmul primitive per chunk size 1..max (oneDNN
 * caches their generated code per process, so rowmms of one shape share
 * it), all reading one copy of the weights reordered into the blocked
 * format the primitives ask for (the same for every row count, checked). */
#include "rowmm.h"

#include <cblas.h>
#include <dnnl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "onednn.h"
#include "rng.h"

/* Debian's oneDNN runs on OpenMP (libgomp): see bf16.c. */
void omp_set_num_threads(int n);

struct pw_rowmm {
  int C, OC;
  int M;                 /* chunk sizes 1..M have a primitive; 0: the sgemv path */
  const float *w, *bias; /* the sgemv path reads them in place */
  dnnl_stream_t st;
  dnnl_memory_t wmem, bmem; /* packed weights, the bias (NULL: none) */
  dnnl_primitive_t prim[PW_ROWMM_MAX_M];
  dnnl_memory_t src[PW_ROWMM_MAX_M], dst[PW_ROWMM_MAX_M];
  char path[160];
};

static atomic_int forced;

void pw_rowmm_force_sgemv(int on) { atomic_store(&forced, !!on); }

static int md2(dnnl_memory_desc_t *md, int rows, int cols, dnnl_format_tag_t tag) {
  dnnl_dims_t dims = {rows, cols};
  return dnnl_memory_desc_init_by_tag(md, 2, dims, dnnl_f32, tag) != dnnl_success;
}

/* The primitive for chunks of m rows; its weights' format into *wmd for
 * m = 1, compared with *wmd after. Nonzero: no fast kernel, or another
 * weight format. */
static int make_prim(pw_rowmm *r, int m, dnnl_memory_desc_t *wmd) {
  dnnl_memory_desc_t a, b, bias, c;
  dnnl_matmul_desc_t mm;
  dnnl_primitive_desc_t pd = NULL;
  const char *impl = NULL;
  int bad = md2(&a, m, r->C, dnnl_ab) || md2(&b, r->C, r->OC, dnnl_format_tag_any) ||
            md2(&bias, 1, r->OC, dnnl_ab) || md2(&c, m, r->OC, dnnl_ab) ||
            dnnl_matmul_desc_init(&mm, &a, &b, r->bias ? &bias : NULL, &c) != dnnl_success ||
            dnnl_primitive_desc_create(&pd, &mm, NULL, pw_onednn_engine(), NULL) != dnnl_success ||
            dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) != dnnl_success ||
            !impl || strstr(impl, "ref"); /* a reference kernel is far slower than sgemv */
  const dnnl_memory_desc_t *w = bad ? NULL : dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
  if (!bad && m == 1) {
    *wmd = *w;
    snprintf(r->path, sizeof r->path, "onednn:%s", impl);
  }
  bad = bad || !dnnl_memory_desc_equal(wmd, w) || dnnl_primitive_create(&r->prim[m - 1], pd) != dnnl_success ||
        dnnl_memory_create(&r->src[m - 1], &a, pw_onednn_engine(), DNNL_MEMORY_NONE) != dnnl_success ||
        dnnl_memory_create(&r->dst[m - 1], &c, pw_onednn_engine(), DNNL_MEMORY_NONE) != dnnl_success;
  if (pd) dnnl_primitive_desc_destroy(pd);
  return bad;
}

/* w (OC, C) and bias into the packed weights (made on the first call).
 * w row-major is B = w^T (C, OC) stored column-major: tag ba. */
static int pack(pw_rowmm *r, const dnnl_memory_desc_t *wmd, const float *w, const float *bias) {
  dnnl_memory_desc_t plain, bmd;
  dnnl_memory_t from = NULL;
  dnnl_primitive_desc_t pd = NULL;
  dnnl_primitive_t re = NULL;
  dnnl_engine_t eng = pw_onednn_engine();
  int bad = md2(&plain, r->C, r->OC, dnnl_ba) || dnnl_memory_create(&from, &plain, eng, (void *)w) != dnnl_success ||
            (!r->wmem && dnnl_memory_create(&r->wmem, wmd, eng, DNNL_MEMORY_ALLOCATE) != dnnl_success) ||
            dnnl_reorder_primitive_desc_create(&pd, &plain, eng, wmd, eng, NULL) != dnnl_success ||
            dnnl_primitive_create(&re, pd) != dnnl_success;
  if (!bad) {
    dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, r->wmem}};
    bad = dnnl_primitive_execute(re, r->st, 2, args) != dnnl_success || dnnl_stream_wait(r->st) != dnnl_success;
  }
  if (!bad && bias) {
    void *h = NULL;
    bad = (!r->bmem && (md2(&bmd, 1, r->OC, dnnl_ab) ||
                        dnnl_memory_create(&r->bmem, &bmd, eng, DNNL_MEMORY_ALLOCATE) != dnnl_success)) ||
          dnnl_memory_get_data_handle(r->bmem, &h) != dnnl_success || !h;
    if (!bad) memcpy(h, bias, sizeof(float) * (size_t)r->OC);
  }
  if (re) dnnl_primitive_destroy(re);
  if (pd) dnnl_primitive_desc_destroy(pd);
  if (from) dnnl_memory_destroy(from);
  return bad;
}

/* One chunk of m rows through its primitive. */
static void chunk(pw_rowmm *r, float *out, const float *inp, int m) {
  dnnl_memory_t a = r->src[m - 1], c = r->dst[m - 1];
  dnnl_memory_set_data_handle(a, (void *)inp);
  dnnl_memory_set_data_handle(c, out);
  dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, r->wmem}, {DNNL_ARG_DST, c},
                             {DNNL_ARG_BIAS, r->bmem}};
  if (dnnl_primitive_execute(r->prim[m - 1], r->st, r->bmem ? 4 : 3, args) != dnnl_success ||
      dnnl_stream_wait(r->st) != dnnl_success) {
    /* the kernels have no error path, and another path would change bits */
    pw_error("rowmm: oneDNN failed a %dx%dx%d product it had accepted", m, r->C, r->OC);
    abort();
  }
}

/* Random weights (and bias) packed, random rows at every chunk size and
 * position against each row alone: 0 when all are the same bits, else the
 * first chunk size that differs. Not the layer's own weights: zeros (a
 * program not loaded yet) would agree under any summation order. */
static int probe(pw_rowmm *r, const dnnl_memory_desc_t *wmd) {
  int M = r->M, bad = 0;
  size_t nw = (size_t)r->OC * (size_t)r->C, nx = (size_t)M * (size_t)r->C, ny = (size_t)M * (size_t)r->OC;
  float *w = malloc(sizeof(float) * (nw + (size_t)r->OC + nx + 2 * ny));
  if (!w) return 1;
  float *b = w + nw, *x = b + r->OC, *one = x + nx, *all = one + ny;
  pw_rng g;
  pw_rng_seed(&g, pw_hash64((uint64_t)r->C, (uint64_t)r->OC));
  for (size_t i = 0; i < nw + (size_t)r->OC + nx; i++) w[i] = (float)(2 * pw_rng_uniform(&g) - 1);
  bad = pack(r, wmd, w, r->bias ? b : NULL);
  for (int p = 0; p < M && !bad; p++) chunk(r, one + (size_t)p * r->OC, x + (size_t)p * r->C, 1);
  for (int m = 2; m <= M && !bad; m++) {
    chunk(r, all, x, m);
    if (memcmp(all, one, sizeof(float) * (size_t)m * (size_t)r->OC)) bad = m;
  }
  free(w);
  return bad;
}

static void release(pw_rowmm *r) {
  for (int m = 0; m < PW_ROWMM_MAX_M; m++) {
    if (r->prim[m]) dnnl_primitive_destroy(r->prim[m]);
    if (r->src[m]) dnnl_memory_destroy(r->src[m]);
    if (r->dst[m]) dnnl_memory_destroy(r->dst[m]);
    r->prim[m] = NULL, r->src[m] = r->dst[m] = NULL;
  }
  if (r->wmem) dnnl_memory_destroy(r->wmem);
  if (r->bmem) dnnl_memory_destroy(r->bmem);
  if (r->st) dnnl_stream_destroy(r->st);
  r->wmem = r->bmem = NULL, r->st = NULL;
  r->M = 0;
}

int pw_rowmm_create(const float *w, const float *bias, int C, int OC, pw_rowmm **out, pw_err *err) {
  *out = NULL;
  if (C < 1 || OC < 1 || !w) return pw_err_set(err, PW_EINVAL, "rowmm", "bad shape %d -> %d", C, OC);
  pw_rowmm *r = calloc(1, sizeof *r);
  if (!r) return pw_err_set(err, PW_ENOMEM, "rowmm", "out of memory");
  *r = (pw_rowmm){.C = C, .OC = OC, .w = w, .bias = bias};
  snprintf(r->path, sizeof r->path, "sgemv");
  if (atomic_load(&forced)) {
    snprintf(r->path, sizeof r->path, "sgemv (forced)");
  } else if (pw_onednn_engine()) {
    omp_set_num_threads(1);
    dnnl_memory_desc_t wmd;
    int bad = dnnl_stream_create(&r->st, pw_onednn_engine(), dnnl_stream_default_flags) != dnnl_success, m = 0;
    for (int k = 1; k <= PW_ROWMM_MAX_M && !bad; k++) bad = make_prim(r, k, &wmd);
    r->M = PW_ROWMM_MAX_M;
    if (bad || (m = probe(r, &wmd)) == 1 || (!m && pack(r, &wmd, w, bias))) {
      snprintf(r->path, sizeof r->path, "sgemv (oneDNN: no fast kernel with one weight format, or no memory)");
      release(r);
    } else if (m) {
      char impl[64];
      snprintf(impl, sizeof impl, "%.60s", r->path);
      snprintf(r->path, sizeof r->path, "sgemv (%s rounds rows of %d otherwise)", impl, m);
      release(r);
    }
  }
  *out = r;
  return 0;
}

void pw_rowmm_free(pw_rowmm *r) {
  if (!r) return;
  release(r);
  free(r);
}

void pw_rowmm_run(pw_rowmm *r, float *out, const float *inp, int N) {
  if (r->M) {
    omp_set_num_threads(1); /* per calling thread in OpenMP */
    for (int i = 0; i < N; i += r->M) {
      int m = N - i < r->M ? N - i : r->M;
      chunk(r, out + (size_t)i * r->OC, inp + (size_t)i * r->C, m);
    }
    return;
  }
  for (int i = 0; i < N; i++) {
    float *o = out + (size_t)i * r->OC;
    if (r->bias) memcpy(o, r->bias, sizeof(float) * (size_t)r->OC);
    cblas_sgemv(CblasRowMajor, CblasNoTrans, r->OC, r->C, 1.0f, r->w, r->C, inp + (size_t)i * r->C, 1,
                r->bias ? 1.0f : 0.0f, o, 1);
  }
}

int pw_rowmm_packed(const pw_rowmm *r) { return r->M > 0; }
const char *pw_rowmm_path(const pw_rowmm *r) { return r->path; }

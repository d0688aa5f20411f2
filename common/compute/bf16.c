/* bf16: the conversions and the two paths of pw_gemm_bf16 (bf16.h).
 *
 * The oneDNN path keeps one primitive per call shape (a linear layer has
 * three: forward, backward-input, backward-weight), made at the shape's
 * first call and kept for the process (making one generates its kernels'
 * code). The memory objects are made once per primitive and pointed at the
 * caller's arrays per call. */
#include "bf16.h"

#include <cblas.h>
#include <dnnl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "gemm.h"
#include "log.h"
#include "onednn.h"
#include "ops.h"

/* ---- conversions ---------------------------------------------------------- */

/* Round to nearest even on the bits; a NaN keeps its sign and top payload
 * bits and is made quiet (bit 6 of the bf16), so it cannot round to inf. */
static inline pw_bf16 round_bits(uint32_t u) {
  uint32_t nan = (u & 0x7fffffffu) > 0x7f800000u;
  uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return (pw_bf16)(nan ? (u >> 16) | 0x40u : r);
}

PW_CPU_DISPATCH(pw_bf16_from_f32, (pw_bf16 * dst, const float *src, size_t n), (dst, src, n)) {
  for (size_t i = 0; i < n; i++) {
    uint32_t u;
    memcpy(&u, &src[i], sizeof u);
    dst[i] = round_bits(u);
  }
}

PW_CPU_DISPATCH(pw_bf16_to_f32, (float *dst, const pw_bf16 *src, size_t n), (dst, src, n)) {
  for (size_t i = 0; i < n; i++) {
    uint32_t u = (uint32_t)src[i] << 16;
    memcpy(&dst[i], &u, sizeof u);
  }
}

/* From the end, a block at a time through a copy: the floats written
 * cover only bf16s at the block's index or above, all read by then. */
void pw_bf16_widen_inplace(float *x, size_t n) {
  enum { BLK = 1024 };
  pw_bf16 tmp[BLK];
  const pw_bf16 *src = (const pw_bf16 *)(void *)x;
  while (n) {
    size_t k = n > BLK ? BLK : n, at = n - k;
    memcpy(tmp, src + at, k * sizeof *tmp);
    pw_bf16_to_f32(x + at, tmp, k);
    n = at;
  }
}

PW_CPU_DISPATCH(pw_bf16_round_f32, (float *x, size_t n), (x, n)) {
  for (size_t i = 0; i < n; i++) {
    uint32_t u;
    memcpy(&u, &x[i], sizeof u);
    u = (uint32_t)round_bits(u) << 16;
    memcpy(&x[i], &u, sizeof u);
  }
}

pw_bf16 pw_bf16_of(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return round_bits(u);
}

float pw_bf16_value(pw_bf16 b) {
  uint32_t u = (uint32_t)b << 16;
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

/* ---- the sgemm path ------------------------------------------------------- */

/* Widened copies of the operands: grow-only, kept for the process (a
 * training step calls with the same few sizes), one pair per calling
 * thread would leak at thread exit, so one pair under a lock. */
static pthread_mutex_t wide_lock = PTHREAD_MUTEX_INITIALIZER;
static float *wide[2];
static size_t wide_cap[2];

static float *widen(int k, const pw_bf16 *src, int rows, int cols, int ld) {
  size_t need = (size_t)rows * (size_t)cols;
  if (need > wide_cap[k]) {
    float *p = realloc(wide[k], need * sizeof(float));
    if (!p) return NULL;
    wide[k] = p;
    wide_cap[k] = need;
  }
  for (int r = 0; r < rows; r++) pw_bf16_to_f32(wide[k] + (size_t)r * cols, src + (size_t)r * ld, (size_t)cols);
  return wide[k];
}

static void gemm_sgemm(int ta, int tb, int M, int N, int K, const pw_bf16 *A, int lda, const pw_bf16 *B, int ldb,
                       int acc, float *C, int ldc) {
  pthread_mutex_lock(&wide_lock);
  /* stored shapes: A (M,K) or (K,M); B (K,N) or (N,K) */
  float *a = widen(0, A, ta ? K : M, ta ? M : K, lda);
  float *b = a ? widen(1, B, tb ? N : K, tb ? K : N, ldb) : NULL;
  if (!b) {
    pthread_mutex_unlock(&wide_lock);
    pw_error("bf16 gemm: out of memory widening %dx%dx%d", M, N, K);
    abort(); /* the kernels have no error path: as a failed first touch would */
  }
  pw_sgemm(ta, tb, M, N, K, 1.0f, a,
              ta ? M : K, b, tb ? K : N, acc ? 1.0f : 0.0f, C, ldc);
  pthread_mutex_unlock(&wide_lock);
}

/* ---- the oneDNN path ------------------------------------------------------ */

/* Debian's oneDNN runs on OpenMP (libgomp); declared here rather than
 * through <omp.h>, which clang has only with libomp's headers. */
void omp_set_num_threads(int n);

typedef struct {
  int ta, tb, M, N, K, lda, ldb, ldc, acc;
} shape;

typedef struct {
  shape s;
  dnnl_primitive_t prim; /* NULL: oneDNN refused the shape, use sgemm */
  dnnl_memory_t a, b, c;
  dnnl_stream_t st;
  pthread_mutex_t lock;  /* one call at a time per primitive (its memory objects) */
} entry;

#define MAX_PRIMS 1024

static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static entry *table[MAX_PRIMS];
static int n_table;
static dnnl_engine_t engine;
static atomic_int native = -1; /* -1: not decided */
static char impl_name[96] = "sgemm";

static void decide(void) {
  static int told;
  if (native >= 0) return;
  native = pw_cpu_bf16() && (engine = pw_onednn_engine()) != NULL;
  if (!told++) /* once: which path this process's bf16 runs take */
    pw_info("bf16 matrix multiplies: %s%s", native ? "oneDNN, up to " : "",
            native ? pw_onednn_isa() /* avx512_core_amx: the AMX tiles */
                   : "bf16 operands widened, OpenBLAS sgemm (no AVX512_BF16, or PW_CPU below avx512)");
}

static int make_md(dnnl_memory_desc_t *md, int rows, int cols, int trans, int ld, dnnl_data_type_t dt) {
  dnnl_dims_t dims = {rows, cols};
  dnnl_dims_t strides = {trans ? 1 : ld, trans ? ld : 1};
  return dnnl_memory_desc_init_by_strides(md, 2, dims, dt, strides) != dnnl_success;
}

/* The primitive for s (made now if new); NULL when oneDNN has none. */
static entry *lookup(const shape *s) {
  pthread_mutex_lock(&table_lock);
  for (int i = 0; i < n_table; i++)
    if (!memcmp(&table[i]->s, s, sizeof *s)) {
      pthread_mutex_unlock(&table_lock);
      return table[i];
    }
  entry *e = n_table < MAX_PRIMS ? calloc(1, sizeof *e) : NULL;
  if (!e) {
    pthread_mutex_unlock(&table_lock);
    return NULL;
  }
  e->s = *s;
  pthread_mutex_init(&e->lock, NULL);
  dnnl_memory_desc_t amd, bmd, cmd;
  dnnl_matmul_desc_t mm;
  dnnl_primitive_attr_t attr = NULL;
  dnnl_post_ops_t po = NULL;
  dnnl_primitive_desc_t pd = NULL;
  int bad = make_md(&amd, s->M, s->K, s->ta, s->lda, dnnl_bf16) || make_md(&bmd, s->K, s->N, s->tb, s->ldb, dnnl_bf16) ||
            make_md(&cmd, s->M, s->N, 0, s->ldc, dnnl_f32) ||
            dnnl_matmul_desc_init(&mm, &amd, &bmd, NULL, &cmd) != dnnl_success ||
            dnnl_primitive_attr_create(&attr) != dnnl_success;
  if (!bad && s->acc) /* C += A B: the sum post-op adds the old C */
    bad = dnnl_post_ops_create(&po) != dnnl_success || dnnl_post_ops_append_sum(po, 1.0f) != dnnl_success ||
          dnnl_primitive_attr_set_post_ops(attr, po) != dnnl_success;
  bad = bad || dnnl_primitive_desc_create(&pd, &mm, attr, engine, NULL) != dnnl_success;
  const char *impl = NULL;
  if (!bad) {
    dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
    /* a reference implementation would be far slower than sgemm */
    bad = !impl || strstr(impl, "ref") != NULL;
  }
  bad = bad || dnnl_primitive_create(&e->prim, pd) != dnnl_success ||
        dnnl_memory_create(&e->a, &amd, engine, DNNL_MEMORY_NONE) != dnnl_success ||
        dnnl_memory_create(&e->b, &bmd, engine, DNNL_MEMORY_NONE) != dnnl_success ||
        dnnl_memory_create(&e->c, &cmd, engine, DNNL_MEMORY_NONE) != dnnl_success ||
        dnnl_stream_create(&e->st, engine, dnnl_stream_default_flags) != dnnl_success;
  if (bad) {
    pw_warn("bf16 gemm: oneDNN has no fast kernel for %dx%dx%d (%s): using sgemm", s->M, s->N, s->K,
            impl ? impl : "none");
    if (e->prim) dnnl_primitive_destroy(e->prim);
    e->prim = NULL;
  } else if (n_table == 0) {
    snprintf(impl_name, sizeof impl_name, "onednn:%s", impl);
  }
  if (pd) dnnl_primitive_desc_destroy(pd);
  if (po) dnnl_post_ops_destroy(po);
  if (attr) dnnl_primitive_attr_destroy(attr);
  table[n_table++] = e;
  pthread_mutex_unlock(&table_lock);
  return e;
}

static int gemm_onednn(const shape *s, const pw_bf16 *A, const pw_bf16 *B, float *C) {
  entry *e = lookup(s);
  if (!e || !e->prim) return -1;
  pthread_mutex_lock(&e->lock);
  /* oneDNN runs on OpenMP threads: as many as OpenBLAS is given */
  omp_set_num_threads(openblas_get_num_threads());
  int rc = -1;
  dnnl_memory_set_data_handle(e->a, (void *)A);
  dnnl_memory_set_data_handle(e->b, (void *)B);
  dnnl_memory_set_data_handle(e->c, C);
  dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, e->a}, {DNNL_ARG_WEIGHTS, e->b}, {DNNL_ARG_DST, e->c}};
  if (dnnl_primitive_execute(e->prim, e->st, 3, args) == dnnl_success && dnnl_stream_wait(e->st) == dnnl_success)
    rc = 0;
  pthread_mutex_unlock(&e->lock);
  return rc;
}

void pw_gemm_bf16(int ta, int tb, int M, int N, int K, const pw_bf16 *A, int lda, const pw_bf16 *B, int ldb,
                  int acc, float *C, int ldc) {
  if (pw_gemm_bf16_native()) {
    shape s = {!!ta, !!tb, M, N, K, lda, ldb, ldc, !!acc};
    if (!gemm_onednn(&s, A, B, C)) return;
  }
  gemm_sgemm(ta, tb, M, N, K, A, lda, B, ldb, acc, C, ldc);
}

int pw_gemm_bf16_native(void) {
  if (native < 0) {
    pthread_mutex_lock(&table_lock);
    decide();
    pthread_mutex_unlock(&table_lock);
  }
  return native;
}

int pw_gemm_bf16_force(int want) {
  pthread_mutex_lock(&table_lock);
  native = -1;
  decide();
  if (!want) native = 0;
  pthread_mutex_unlock(&table_lock);
  return native;
}

const char *pw_gemm_bf16_name(void) { return pw_gemm_bf16_native() ? impl_name : "sgemm"; }

/* ---- the linear layer ------------------------------------------------------ */

void pw_linear_forward_bf16(float *out, const float *inp, const float *w, pw_bf16 *wb, pw_bf16 *xb,
                            const float *bias, int N, int C, int OC) {
  if (N <= 0 || OC <= 0) return;
  if (C <= 0) { /* nothing to multiply: the float32 kernel's answer */
    pw_linear_forward(out, inp, w, bias, N, C, OC);
    return;
  }
  pw_bf16_from_f32(wb, w, (size_t)OC * C);
  pw_bf16_from_f32(xb, inp, (size_t)N * C);
  if (bias)
    for (int n = 0; n < N; n++) memcpy(out + (size_t)n * OC, bias, (size_t)OC * sizeof(float));
  /* out (N,OC) (+)= x (N,C) @ w^T, w (OC,C) */
  pw_gemm_bf16(0, 1, N, OC, C, xb, C, wb, C, bias != NULL, out, OC);
}

void pw_linear_backward_input_bf16(float *dinp, const float *dout, const pw_bf16 *wb, pw_bf16 *dyb, int N, int C,
                                   int OC, int acc) {
  if (N <= 0 || C <= 0) return;
  if (OC <= 0) {
    if (!acc) memset(dinp, 0, (size_t)N * C * sizeof(float));
    return;
  }
  pw_bf16_from_f32(dyb, dout, (size_t)N * OC);
  /* dinp (N,C) (+)= dout (N,OC) @ w (OC,C) */
  pw_gemm_bf16(0, 0, N, C, OC, dyb, OC, wb, C, acc, dinp, C);
}

/* have_dyb: dyb already holds dout converted */
static void backward_weight(float *dw, float *dbias, const float *dout, const float *inp, pw_bf16 *dyb, pw_bf16 *xb,
                            int N, int C, int OC, int have_dyb) {
  if (N <= 0 || OC <= 0) return;
  if (dw && C > 0) {
    if (!have_dyb) pw_bf16_from_f32(dyb, dout, (size_t)N * OC);
    pw_bf16_from_f32(xb, inp, (size_t)N * C);
    /* dw (OC,C) += dout^T (OC,N) @ x (N,C) */
    pw_gemm_bf16(1, 0, OC, C, N, dyb, OC, xb, C, 1, dw, C);
  }
  pw_linear_backward_weight(NULL, dbias, dout, inp, N, C, OC); /* the bias in float32 */
}

void pw_linear_backward_weight_bf16(float *dw, float *dbias, const float *dout, const float *inp, pw_bf16 *dyb,
                                    pw_bf16 *xb, int N, int C, int OC) {
  backward_weight(dw, dbias, dout, inp, dyb, xb, N, C, OC, 0);
}

void pw_linear_backward_bf16(float *dinp, float *dw, float *dbias, const float *dout, const float *inp,
                             const pw_bf16 *wb, pw_bf16 *dyb, pw_bf16 *xb, int N, int C, int OC, int acc) {
  if (N <= 0 || OC <= 0 || C <= 0) { /* the degenerate shapes: as the two calls do them */
    pw_linear_backward_weight_bf16(dw, dbias, dout, inp, dyb, xb, N, C, OC);
    pw_linear_backward_input_bf16(dinp, dout, wb, dyb, N, C, OC, acc);
    return;
  }
  pw_bf16_from_f32(dyb, dout, (size_t)N * OC);
  backward_weight(dw, dbias, dout, inp, dyb, xb, N, C, OC, 1);
  pw_gemm_bf16(0, 0, N, C, OC, dyb, OC, wb, C, acc, dinp, C);
}

/* cu_fa_body: the GPU's tiled attention (attention_tiled, float32 and bf16
 * programs) as FlashAttention-2: the block programs of cu_fa.cu's three
 * kernels, in plain C so that gcc compiles the very same code for
 * tests/unit/test_cu_fa_emul.c, which runs every block on the CPU against
 * ops_flash.c's kernels — the only check the kernels get without a GPU.
 *
 * A block of PW_FA_NT threads runs one block program, in cu_phase.h's
 * phases (what a thread keeps between them lives in shared memory, laid
 * out by pw_cu_fa_layout).
 *
 * The algorithm is ops_flash.c's (ops_flash.h says what is rounded where):
 * - forward, a block per (query tile of BQ rows, query head, sequence): Q
 *   staged once, then for each key tile of BK keys the block's rows see
 *   (causal: none above the diagonal) K and V staged, S = Q K^T, the online
 *   softmax (running max m and sum l per row, the output rescaled by
 *   exp(m_old - m_new)), O += P V; at the end O / l and lse = m + log l.
 *   bf16 prefers BK = PW_ATTN_TILE_K, the CPU's key tile, so that its P =
 *   exp(s - m) is rounded to bf16 against the same running max as the CPU's.
 * - backward, deterministic (no atomics): D = rowsum(dO * O) by a first
 *   launch (pw_cu_fa_d_row), P = exp(s - lse) recomputed where needed; dS
 *   = P (dP - D), dP = dO V^T.
 *   dq: a block per (query tile, query head, sequence) walks its key tiles,
 *   dQ += dS K; dk/dv: a block per (key tile, kv head, sequence) walks the
 *   query tiles of its group's heads that see it, dV += P^T dO, dK += dS^T
 *   Q. Seven products a tile pair against FlashAttention-2's five: the
 *   price of every gradient element summed by one block in a fixed order,
 *   so a run gives the same bits every time.
 * Products: float32 programs in float32 by the threads (each output element
 * a sum over k in order); bf16 programs on the tensor cores through
 * pw_cu_fa_mma16 (one 16x16 output block of a warp: WMMA bf16 16x16x16
 * with float32 accumulation on the GPU, the same products summed by plain
 * loops here), their operands rounded to bf16 (bf16.c's rounding): q, k,
 * v, dout, P before P V and P^T dO, scale * dS
 * before dS K and dS^T Q — the CPU's (q, k, v and dout converted to bf16
 * copies first, qkvb and doutb, as the CPU does). Scores are q.k
 * times scale, as the CPU scales after its product; softmax, D and dS stay
 * float32.
 *
 * Masks (ops.h's pw_attn_mask): causal or not (bidirectional), a sliding
 * window (row r sees keys (r - window, r]), pad keys (the tokens' pad
 * masked; a row whose keys are all pad attends uniformly to them, scores 0,
 * no gradient to q or k from it), as ops_flash.c; the forward's key tiles
 * start at its first row's first key, as the CPU's.
 *
 * Shapes: qkv rows of W = C + 2 NKV HD (q of head h at h HD, k of kv head g
 * at C + g HD, v at C + NKV HD + g HD; query head h reads kv head h / G,
 * G = NH / NKV), out and dout (B, T, C), lse (B, NH, T); gradients stored as
 * (acc ? old : 0) + g. Any HD whose tiles fit the shared memory (to about
 * 500 in float32): HD is padded to HDP, a multiple of 16, with zeros.
 *
 * Must never: allocate, touch global memory outside the arguments, or let
 * a thread read in a phase what another thread writes in it. */
#ifndef PW_CU_FA_BODY_H
#define PW_CU_FA_BODY_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "cu_bf16_body.h"
#include "cu_phase.h"
#include "hd.h"
#include "optable.h"

#define PW_FA_NT PW_PH_NT /* threads of a block */
#define PW_FA_NW PW_PH_NW /* its warps */
/* Shared memory a block may take: sm_90's opt-in limit, 227 KiB. */
#define PW_FA_SMEM_MAX (227u * 1024u)

enum { PW_FA_FWD, PW_FA_DQ, PW_FA_DKV };

/* One call's shapes, its kernel's tiles and their places in the block's
 * shared memory (byte offsets; 0 for a tile the kernel does not have). */
typedef struct {
  int B, T, C, NH, NKV, HD, G;
  size_t W;    /* a packed qkv row: C + 2 NKV HD */
  float scale; /* 1 / sqrtf(HD), as the CPU computes it */
  int causal;  /* row r sees keys 0..r (else every key: bidirectional) */
  int window;  /* > 0 (causal): row r sees keys (r - window, r] only (a sliding window) */
  const int32_t *tok; /* (B, T) tokens: keys whose token is pad are masked; NULL: none */
  int32_t pad;
  /* bf16 programs: the bf16 copies of qkv and (backward) dout the tiles
   * are staged from (cu_fa.cu converts them first: the CPU's bits) */
  const uint16_t *qkvb, *doutb;
  const float *D; /* the backward's (B, NH, T): rowsum(dout * out), pw_cu_fa_d_row's */
  int bf16;    /* bf16 operands, tensor-core products */
  int HDP;     /* HD rounded up to 16 */
  int BQ, BK;  /* query rows and keys of a tile */
  int TPR;     /* threads a row in the row phases: PW_FA_NT / BQ */
  int ldo;     /* operand tiles' row (elements): HD + 1 float32 (no bank conflicts), HDP + 8 bf16 */
  int lds;     /* float32 score tiles' row: BK + 4 */
  int ldp;     /* bf16 P and dS tiles' row: BK + 8 */
  int lda;     /* float32 accumulator tiles' row: HDP + 4 */
  unsigned o_q, o_do, o_k, o_v, o_s, o_dp, o_pb, o_dsb, o_a1, o_a2; /* tiles */
  /* per-row floats (forward: r1 m, r2 l, r3 the rescale al, r4 the new max;
   * backward: r1 lse, r2 D; ru the uniform-row flags) and per-thread
   * partials (forward: red the rows' maxima, red2 their sums) */
  unsigned o_r1, o_r2, o_r3, o_r4, o_ru, o_red, o_red2;
  unsigned bytes;
} pw_cu_fa;

/* The shapes of a call (host side); tiles not yet chosen. */
static inline pw_cu_fa pw_cu_fa_make(int B, int T, int C, int NH, int NKV, int bf16) {
  pw_cu_fa d = {0};
  d.B = B, d.T = T, d.C = C, d.NH = NH, d.NKV = NKV > 0 ? NKV : NH;
  d.HD = NH > 0 ? C / NH : 0;
  d.G = d.NKV > 0 ? d.NH / d.NKV : 0;
  d.W = (size_t)C + 2 * (size_t)d.NKV * (size_t)d.HD;
  d.scale = d.HD > 0 ? 1.0f / sqrtf((float)d.HD) : 0.0f;
  d.causal = 1;
  d.bf16 = bf16;
  d.HDP = (d.HD + 15) / 16 * 16;
  return d;
}

static inline PW_HD unsigned pw_cu_fa__take(unsigned *at, size_t bytes) {
  unsigned o = *at;
  *at += (unsigned)((bytes + 127) / 128 * 128); /* WMMA wants 32-byte aligned tiles */
  return o;
}

/* Kernel `kind`'s tiles of BQ rows and BK keys laid out in d. */
static inline PW_HD void pw_cu_fa_layout(pw_cu_fa *d, int kind, int BQ, int BK) {
  unsigned at = 0;
  size_t es = d->bf16 ? 2 : 4;
  d->BQ = BQ, d->BK = BK, d->TPR = PW_FA_NT / BQ;
  d->ldo = d->bf16 ? d->HDP + 8 : d->HD + 1;
  d->lds = BK + 4, d->ldp = BK + 8, d->lda = d->HDP + 4;
  d->o_q = d->o_do = d->o_k = d->o_v = d->o_s = d->o_dp = d->o_pb = d->o_dsb = d->o_a1 = d->o_a2 = 0;
  d->o_r1 = d->o_r2 = d->o_r3 = d->o_r4 = d->o_ru = d->o_red = d->o_red2 = 0;
  size_t qt = (size_t)BQ * d->ldo * es, kt = (size_t)BK * d->ldo * es;
  size_t st = (size_t)BQ * d->lds * 4, pt = (size_t)BQ * d->ldp * 2, rows = (size_t)BQ * 4, red = PW_FA_NT * 4;
  d->o_q = pw_cu_fa__take(&at, qt);
  if (kind != PW_FA_FWD) d->o_do = pw_cu_fa__take(&at, qt);
  d->o_k = pw_cu_fa__take(&at, kt);
  d->o_v = pw_cu_fa__take(&at, kt);
  d->o_s = pw_cu_fa__take(&at, st);
  if (kind != PW_FA_FWD) d->o_dp = pw_cu_fa__take(&at, st);
  if (d->bf16 && kind != PW_FA_DQ) d->o_pb = pw_cu_fa__take(&at, pt);
  if (d->bf16 && kind != PW_FA_FWD) d->o_dsb = pw_cu_fa__take(&at, pt);
  d->o_a1 = pw_cu_fa__take(&at, (size_t)(kind == PW_FA_DKV ? BK : BQ) * d->lda * 4);
  if (kind == PW_FA_DKV) d->o_a2 = pw_cu_fa__take(&at, (size_t)BK * d->lda * 4);
  d->o_r1 = pw_cu_fa__take(&at, rows);
  d->o_r2 = pw_cu_fa__take(&at, rows);
  d->o_ru = pw_cu_fa__take(&at, rows);
  if (kind == PW_FA_FWD) {
    d->o_r3 = pw_cu_fa__take(&at, rows);
    d->o_r4 = pw_cu_fa__take(&at, rows);
    d->o_red = pw_cu_fa__take(&at, red);
    d->o_red2 = pw_cu_fa__take(&at, red);
  }
  d->bytes = at;
}

/* Picks kernel `kind`'s tiles: the first of its list whose shared memory
 * fits PW_FA_SMEM_MAX. The forward prefers the CPU's key tile (128: a bf16
 * forward then rounds its P as the CPU does), the backwards 64 x 64. 0, or
 * -1 when not even 16 x 16 fits (HD too wide). */
static inline int pw_cu_fa_plan(pw_cu_fa *d, int kind) {
  static const int fwd[][2] = {{32, PW_ATTN_TILE_K}, {16, PW_ATTN_TILE_K}, {32, 64}, {16, 64}, {16, 32}, {16, 16}};
  static const int bwd[][2] = {{64, 64}, {32, 64}, {64, 32}, {32, 32}, {16, 32}, {32, 16}, {16, 16}};
  const int(*list)[2] = kind == PW_FA_FWD ? fwd : bwd;
  int n = kind == PW_FA_FWD ? (int)(sizeof fwd / sizeof fwd[0]) : (int)(sizeof bwd / sizeof bwd[0]);
  for (int i = 0; i < n; i++) {
    pw_cu_fa_layout(d, kind, list[i][0], list[i][1]);
    if (d->bytes <= PW_FA_SMEM_MAX) return 0;
  }
  return -1;
}

/* Blocks of each kernel: (x, y, z) = (tiles, heads, sequences). */
static inline PW_HD int pw_cu_fa_tiles(int T, int b) { return (T + b - 1) / b; }

/* ---- small pieces ------------------------------------------------------------------ */

static inline PW_HD int pw_cu_fa_min(int a, int b) { return a < b ? a : b; }

/* Row r's keys: [lo, hi) (ops_flash.c's key_lo and seen). */
static inline PW_HD int pw_cu_fa_lo(const pw_cu_fa *d, int r) {
  return d->window > 0 && r + 1 > d->window ? r + 1 - d->window : 0;
}
static inline PW_HD int pw_cu_fa_hi(const pw_cu_fa *d, int r) {
  return !d->causal ? d->T : r + 1 < d->T ? r + 1 : d->T;
}

/* 1 when all of row r's keys are pad (tok: its sequence's tokens): the row
 * attends uniformly to them, a constant (ops_flash.h: HF BERT's mask). */
static inline PW_HD int pw_cu_fa_uniform(const pw_cu_fa *d, const int32_t *tok, int r) {
  if (!tok || r >= d->T) return 0;
  for (int k = pw_cu_fa_lo(d, r), hi = pw_cu_fa_hi(d, r); k < hi; k++)
    if (tok[k] != d->pad) return 0;
  return 1;
}

/* Does query row r see key k? Within its keys and not pad, or (u: a
 * uniform row) any of its keys. */
static inline PW_HD int pw_cu_fa_sees(const pw_cu_fa *d, const int32_t *tok, int r, int k, int u) {
  return r < d->T && k >= pw_cu_fa_lo(d, r) && k < pw_cu_fa_hi(d, r) && (u || !tok || tok[k] != d->pad);
}

/* Sequence b's tokens, or NULL (no pad mask). */
static inline PW_HD const int32_t *pw_cu_fa_tok(const pw_cu_fa *d, int b) {
  return d->tok ? d->tok + (size_t)b * (size_t)d->T : NULL;
}


/* bf16 bits as float (exact) */
static inline PW_HD float pw_cu_fa_bf(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float y;
  memcpy(&y, &u, sizeof y);
  return y;
}

#define PW_FA_F(sm, o) ((float *)((sm) + (o)))
#define PW_FA_H(sm, o) ((uint16_t *)((sm) + (o)))

/* Thread t's share of the rows' uniform flags (1.0f or 0) into o_ru. */
PW_PH_FN void pw_cu_fa_rows_u(const pw_cu_fa *d, unsigned char *sm, const int32_t *tok, int r0, int t) {
  for (int i = t; i < d->BQ; i += PW_FA_NT) PW_FA_F(sm, d->o_ru)[i] = pw_cu_fa_uniform(d, tok, r0 + i) ? 1.0f : 0.0f;
}

/* q of head h, k and v of kv head g, out (or dout) of head h: row r of
 * sequence b (row r + 1 at + W, or + C for out) */
static inline PW_HD size_t pw_cu_fa_q(const pw_cu_fa *d, int b, int h, int r) {
  return ((size_t)b * d->T + (size_t)r) * d->W + (size_t)h * d->HD;
}
static inline PW_HD size_t pw_cu_fa_k(const pw_cu_fa *d, int b, int g, int r) {
  return ((size_t)b * d->T + (size_t)r) * d->W + (size_t)d->C + (size_t)g * d->HD;
}
static inline PW_HD size_t pw_cu_fa_v(const pw_cu_fa *d, int b, int g, int r) {
  return pw_cu_fa_k(d, b, g, r) + (size_t)d->NKV * d->HD;
}
static inline PW_HD size_t pw_cu_fa_o(const pw_cu_fa *d, int b, int h, int r) {
  return ((size_t)b * d->T + (size_t)r) * (size_t)d->C + (size_t)h * d->HD;
}

/* The exponentials of P. float32 programs: expf, within 2 ulp (the CPU's
 * pw__expf within 1: the equality tests' 1e-5 holds). bf16 programs on
 * the GPU: __expf (ex2.approx; relative error about 1e-6 for the scores'
 * range, 2^-20 where it grows), an eighth of expf's instructions: P is
 * rounded to bf16 (2^-8) before every product it enters, so the CPU's
 * bf16 P tips to another bf16 value only as rarely as a float32 sum order
 * already makes it (test_cuda_bf16's tolerance counts those), and the
 * softmax's sums in float32 move by ~1e-6 of themselves. The emulator
 * runs expf in both (it checks the arithmetic around the exponential, not
 * its last bits). */
#ifdef __CUDACC__
#define PW_FA_EXP(d, x) ((d)->bf16 ? __expf(x) : expf(x))
#else
#define PW_FA_EXP(d, x) expf(x)
#endif

/* 16 bytes from src to dst, both 16-byte aligned (one vector load and
 * store on the GPU); 16 zero bytes. */
#ifdef __CUDACC__
#define PW_FA_COPY16(dst, src) (*(uint4 *)(void *)(dst) = *(const uint4 *)(const void *)(src))
#define PW_FA_ZERO16(dst) (*(uint4 *)(void *)(dst) = make_uint4(0, 0, 0, 0))
#else
#define PW_FA_COPY16(dst, src) memcpy((dst), (src), 16)
#define PW_FA_ZERO16(dst) memset((dst), 0, 16)
#endif

/* Thread t's elements (i, j) of a rows x cols tile, for the statements
 * after the names: elements t, t + NT, ... in row-major order (i = e /
 * cols, j = e % cols); where cols divides NT without a division each (the
 * thread's column is then fixed and its rows step by NT / cols: the same
 * elements). */
#define PW_FA_EACH(t, rows, cols, i, j, ...)                              \
  do {                                                                    \
    int rows_ = (rows), cols_ = (cols);                                   \
    if (PW_FA_NT % cols_ == 0) {                                          \
      int j = (t) % cols_;                                                \
      for (int i = (t) / cols_; i < rows_; i += PW_FA_NT / cols_) {       \
        __VA_ARGS__;                                                      \
      }                                                                   \
    } else {                                                              \
      for (int e_ = (t); e_ < rows_ * cols_; e_ += PW_FA_NT) {            \
        int i = e_ / cols_, j = e_ - i * cols_;                           \
        __VA_ARGS__;                                                      \
      }                                                                   \
    }                                                                     \
  } while (0)

/* Thread t's share of an operand tile (`rows` rows of d->ldo at sm + o):
 * row i < n from element `at` of src (row i at + i ld): float32, or in bf16
 * programs its bf16 copy srcb (HDP columns, the products' k); the rest and
 * the columns past HD zeros. */
PW_PH_FN void pw_cu_fa_load(const pw_cu_fa *d, unsigned char *sm, unsigned o, const float *src, const uint16_t *srcb,
                            size_t at, size_t ld, int n, int rows, int t) {
  /* bf16 rows 16 bytes at a time where the copy's rows and HD allow (the
   * tile's rows are: HDP + 8 elements) */
  if (d->bf16 && d->HD % 8 == 0 && ld % 8 == 0 && at % 8 == 0 && (uintptr_t)srcb % 16 == 0) {
    PW_FA_EACH(t, rows, d->HDP / 8, i, q, {
      uint16_t *dst = PW_FA_H(sm, o) + i * d->ldo + q * 8;
      if (i < n && q * 8 < d->HD)
        PW_FA_COPY16(dst, srcb + at + (size_t)i * ld + (size_t)q * 8);
      else
        PW_FA_ZERO16(dst);
    });
    return;
  }
  if (d->bf16)
    PW_FA_EACH(t, rows, d->HDP, i, c, {
      PW_FA_H(sm, o)[i * d->ldo + c] = i < n && c < d->HD ? srcb[at + (size_t)i * ld + (size_t)c] : (uint16_t)0;
    });
  else
    PW_FA_EACH(t, rows, d->HD, i, c,
               PW_FA_F(sm, o)[i * d->ldo + c] = i < n ? src[at + (size_t)i * ld + (size_t)c] : 0.0f);
}

/* Thread t's share of zeroing n floats at sm + o. */
PW_PH_FN void pw_cu_fa_zero(unsigned char *sm, unsigned o, int n, int t) {
  for (int e = t; e < n; e += PW_FA_NT) PW_FA_F(sm, o)[e] = 0.0f;
}

/* ---- the products ------------------------------------------------------------------- */

/* Up to PW_FA_MMR output rows a thread keeps in registers (the default
 * tiles' products need at most 32 a thread). */
#define PW_FA_MMR 32
#ifdef __CUDACC__
#define PW_FA_UNROLL _Pragma("unroll")
#else
#define PW_FA_UNROLL
#endif

/* float32: C (M x N, row ldc) (+)= op(A) op(B) over k < K, op(A)(i,k) =
 * ta ? A[k lda + i] : A[i lda + k], op(B)(k,j) = tb ? B[j ldb + k] :
 * B[k ldb + j]; thread t's elements t, t + NT, ... (a row's neighbours:
 * the operand tiles' odd rows keep a warp off one bank), each a sum in k
 * order, then added to C (acc) or stored. Where N divides the block the
 * thread's elements share their column: its rows' sums run together, each
 * B(k, j) loaded once for all of them (the same sums). */
PW_PH_FN void pw_cu_fa_mm_f32(int t, float *Cm, int ldc, const float *A, int lda, int ta, const float *Bm, int ldb,
                              int tb, int M, int N, int K, int acc) {
  int as = ta ? lda : 1, bs = tb ? 1 : ldb;
  if (PW_FA_NT % N == 0 && (M + PW_FA_NT / N - 1) / (PW_FA_NT / N) <= PW_FA_MMR) {
    int j = t % N, i0 = t / N, di = PW_FA_NT / N, R = i0 < M ? (M - i0 + di - 1) / di : 0;
    const float *b = Bm + (tb ? j * ldb : j);
    float s[PW_FA_MMR];
    PW_FA_UNROLL
    for (int r = 0; r < PW_FA_MMR; r++) s[r] = 0.0f;
    for (int k = 0; k < K; k++) {
      float bk = b[k * bs];
      PW_FA_UNROLL
      for (int r = 0; r < PW_FA_MMR; r++)
        if (r < R) s[r] += A[ta ? k * lda + i0 + r * di : (i0 + r * di) * lda + k] * bk;
    }
    PW_FA_UNROLL
    for (int r = 0; r < PW_FA_MMR; r++)
      if (r < R) {
        float *c = Cm + (i0 + r * di) * ldc + j;
        *c = acc ? *c + s[r] : s[r];
      }
    return;
  }
  PW_FA_EACH(t, M, N, i, j, {
    const float *a = A + (ta ? i : i * lda), *b = Bm + (tb ? j * ldb : j);
    float s = 0.0f;
    for (int k = 0; k < K; k++) s += a[k * as] * b[k * bs];
    float *c = Cm + i * ldc + j;
    *c = acc ? *c + s : s;
  });
}

#ifndef __CUDACC__
/* One warp's 16 x 16 block of C (row ldc) (+)= op(A) op(B) over K (a
 * multiple of 16) of bf16 operands with float32 sums: what cu_fa.cu's WMMA
 * version does, its products exact in float32 as the tensor cores' are,
 * summed in k order (the hardware's order is its own). */
static inline void pw_cu_fa_mma16(float *Cm, int ldc, const uint16_t *A, int lda, int ta, const uint16_t *Bm, int ldb,
                                  int tb, int K, int acc) {
  float c[16][16], a[16][16], b[16][16];
  for (int i = 0; i < 16; i++)
    for (int j = 0; j < 16; j++) c[i][j] = acc ? Cm[i * ldc + j] : 0.0f;
  for (int k0 = 0; k0 < K; k0 += 16) { /* a 16 x 16 slice of each operand as floats, then k in order */
    for (int i = 0; i < 16; i++)
      for (int k = 0; k < 16; k++) {
        a[i][k] = pw_cu_fa_bf(ta ? A[(k0 + k) * lda + i] : A[i * lda + k0 + k]);
        b[k][i] = pw_cu_fa_bf(tb ? Bm[i * ldb + k0 + k] : Bm[(k0 + k) * ldb + i]);
      }
    for (int i = 0; i < 16; i++)
      for (int j = 0; j < 16; j++) {
        float x = c[i][j];
        for (int k = 0; k < 16; k++) x += a[i][k] * b[k][j];
        c[i][j] = x;
      }
  }
  for (int i = 0; i < 16; i++)
    for (int j = 0; j < 16; j++) Cm[i * ldc + j] = c[i][j];
}
#endif

/* bf16: C (M x N, multiples of 16) (+)= op(A) op(B) on the tensor cores,
 * warp w's 16 x 16 blocks w, w + NW, ... */
PW_PH_FN void pw_cu_fa_mm_bf16(int w, float *Cm, int ldc, const uint16_t *A, int lda, int ta, const uint16_t *Bm,
                               int ldb, int tb, int M, int N, int K, int acc) {
  int nb = N / 16;
  for (int x = w; x < (M / 16) * nb; x += PW_FA_NW) {
    int i0 = x / nb * 16, j0 = (x - x / nb * nb) * 16;
    pw_cu_fa_mma16(Cm + i0 * ldc + j0, ldc, ta ? A + i0 : A + i0 * lda, lda, ta, tb ? Bm + j0 * ldb : Bm + j0, ldb,
                   tb, K, acc);
  }
}

/* A phase: C (M x N) (+)= op(A) op(B), the operands tiles at sm + oa and
 * sm + ob (row d->ldo, or the score tiles': lda_/ldb_ given), float32 or
 * bf16 per d; K the float32 sum's length (the bf16 one: its tile's, a
 * multiple of 16). */
#define PW_FA_MM(d, sm, oc, ldc, oa, lda_, ta, ob, ldb_, tb, M, N, Kf, Kb, acc)                               \
  do {                                                                                                        \
    if ((d)->bf16)                                                                                            \
      PW_PH_WARPS(w_, pw_cu_fa_mm_bf16(w_, PW_FA_F(sm, oc), ldc, PW_FA_H(sm, oa), lda_, ta, PW_FA_H(sm, ob),    \
                                       ldb_, tb, M, N, Kb, acc));                                             \
    else                                                                                                      \
      PW_PH_THREADS(t_, pw_cu_fa_mm_f32(t_, PW_FA_F(sm, oc), ldc, PW_FA_F(sm, oa), lda_, ta, PW_FA_F(sm, ob),   \
                                        ldb_, tb, M, N, Kf, acc));                                            \
  } while (0)

/* ---- forward ------------------------------------------------------------------------ */

/* The previous tile's running sum and max for row i, moved on: l al + the
 * tile's sums (its threads' in order), and its new max (r4). */
static inline PW_HD float pw_cu_fa_l_next(const pw_cu_fa *d, const unsigned char *sm, int i) {
  const float *red2 = (const float *)(sm + d->o_red2) + i * d->TPR;
  float s = 0.0f;
  for (int k = 0; k < d->TPR; k++) s += red2[k];
  return ((const float *)(sm + d->o_r2))[i] * ((const float *)(sm + d->o_r3))[i] + s;
}

/* Row phase 1 of a key tile at c0: (after a tile: a row's thread 0 first
 * moves its l and m on, from that tile's phase 2) each score S(i, j) times
 * scale, in place (0 in a uniform row: its scores are constants); thread
 * (i, p = t % TPR)'s max over the keys j = p, p + TPR, ... row r0 + i sees
 * into red[t] (-inf: none). tok: the sequence's tokens or NULL. */
PW_PH_FN void pw_cu_fa_fwd_max(const pw_cu_fa *d, unsigned char *sm, const int32_t *tok, int r0, int c0, int after,
                               int t) {
  int i = t / d->TPR, p = t - i * d->TPR, u = PW_FA_F(sm, d->o_ru)[i] != 0.0f;
  if (after && p == 0) {
    PW_FA_F(sm, d->o_r2)[i] = pw_cu_fa_l_next(d, sm, i);
    PW_FA_F(sm, d->o_r1)[i] = PW_FA_F(sm, d->o_r4)[i];
  }
  float *S = PW_FA_F(sm, d->o_s) + i * d->lds, mx = -INFINITY;
  for (int j = p; j < d->BK; j += d->TPR) {
    float s = u ? 0.0f : S[j] * d->scale;
    S[j] = s;
    if (pw_cu_fa_sees(d, tok, r0 + i, c0 + j, u) && s > mx) mx = s;
  }
  PW_FA_F(sm, d->o_red)[t] = mx;
}

/* Row phase 2: the row's new max mn (the old m and its threads' maxima),
 * P = exp(s - mn) where the row sees the key, else 0 (bf16: P rounded into
 * the bf16 tile), its threads' sums of P into red2, the factor al = exp(m
 * - mn) the output so far is rescaled by (0 on the first tile: m is -inf)
 * and the rescale of the thread's columns p, p + TPR, ... of the output
 * row; the row's thread 0 keeps mn (r4) and al (r3) for the next phase 1.
 * A row that has seen no key yet keeps P 0. */
PW_PH_FN void pw_cu_fa_fwd_exp(const pw_cu_fa *d, unsigned char *sm, const int32_t *tok, int r0, int c0, int t) {
  int i = t / d->TPR, p = t - i * d->TPR, u = PW_FA_F(sm, d->o_ru)[i] != 0.0f;
  const float *red = PW_FA_F(sm, d->o_red) + i * d->TPR;
  float m = PW_FA_F(sm, d->o_r1)[i], mn = m;
  for (int k = 0; k < d->TPR; k++) mn = red[k] > mn ? red[k] : mn;
  float mu = mn == -INFINITY ? 0.0f : mn, sum = 0.0f, al = PW_FA_EXP(d, m - mu);
  float *S = PW_FA_F(sm, d->o_s) + i * d->lds, *O = PW_FA_F(sm, d->o_a1) + i * d->lda;
  uint16_t *Pb = d->bf16 ? PW_FA_H(sm, d->o_pb) + i * d->ldp : NULL;
  for (int j = p; j < d->BK; j += d->TPR) {
    float e = pw_cu_fa_sees(d, tok, r0 + i, c0 + j, u) ? PW_FA_EXP(d, S[j] - mu) : 0.0f;
    sum += e;
    if (Pb)
      Pb[j] = pw_cu_bf16_bits(e);
    else
      S[j] = e;
  }
  for (int c = p, wd = d->bf16 ? d->HDP : d->HD; c < wd; c += d->TPR) O[c] *= al;
  PW_FA_F(sm, d->o_red2)[t] = sum;
  if (p == 0) {
    PW_FA_F(sm, d->o_r4)[i] = mn;
    PW_FA_F(sm, d->o_r3)[i] = al;
  }
}

/* out = O / l for the tile's rows (1 / l then times, as the CPU), lse = m
 * + log l, l and m moved on from the last tile (after: there was one); a
 * row that saw no key gets zeros (and lse -inf). */
PW_PH_FN void pw_cu_fa_fwd_store(const pw_cu_fa *d, unsigned char *sm, float *out, float *lse, int rows, int after,
                                 int t) {
  const float *O = PW_FA_F(sm, d->o_a1), *m = PW_FA_F(sm, after ? d->o_r4 : d->o_r1), *l = PW_FA_F(sm, d->o_r2);
  PW_FA_EACH(t, rows, d->HD, i, c, {
    float li = after ? pw_cu_fa_l_next(d, sm, i) : l[i];
    float inv = li > 0.0f ? 1.0f / li : 0.0f;
    out[(size_t)i * d->C + (size_t)c] = O[i * d->lda + c] * inv;
  });
  for (int i = t; i < rows; i += PW_FA_NT) lse[i] = m[i] + logf(after ? pw_cu_fa_l_next(d, sm, i) : l[i]);
}

/* The forward of query tile qt of head h of sequence b. */
PW_PH_FN void pw_cu_fa_fwd_block(const pw_cu_fa *d, float *out, float *lse, const float *qkv, int qt, int h, int b,
                                 unsigned char *sm) {
  int r0 = qt * d->BQ, rows = pw_cu_fa_min(d->BQ, d->T - r0), g = h / d->G;
  /* the keys the tile's rows see: from its first row's first (the CPU's
   * tiles start there too) to past its last row's last */
  int kbeg = pw_cu_fa_lo(d, r0), kend = d->causal ? pw_cu_fa_min(d->T, r0 + d->BQ) : d->T;
  int kk = d->bf16 ? d->HDP : d->HD, on = d->bf16 ? d->HDP : d->HD;
  const int32_t *tok = pw_cu_fa_tok(d, b);
  PW_PH_THREADS(t, {
    pw_cu_fa_load(d, sm, d->o_q, qkv, d->qkvb, pw_cu_fa_q(d, b, h, r0), d->W, rows, d->BQ, t);
    pw_cu_fa_zero(sm, d->o_a1, d->BQ * d->lda, t);
    for (int i = t; i < d->BQ; i += PW_FA_NT) PW_FA_F(sm, d->o_r1)[i] = -INFINITY, PW_FA_F(sm, d->o_r2)[i] = 0.0f;
    pw_cu_fa_rows_u(d, sm, tok, r0, t);
  });
  for (int c0 = kbeg; c0 < kend; c0 += d->BK) {
    int cols = pw_cu_fa_min(d->BK, kend - c0);
    PW_PH_THREADS(t, {
      pw_cu_fa_load(d, sm, d->o_k, qkv, d->qkvb, pw_cu_fa_k(d, b, g, c0), d->W, cols, d->BK, t);
      pw_cu_fa_load(d, sm, d->o_v, qkv, d->qkvb, pw_cu_fa_v(d, b, g, c0), d->W, cols, d->BK, t);
    });
    /* S = Q K^T */
    PW_FA_MM(d, sm, d->o_s, d->lds, d->o_q, d->ldo, 0, d->o_k, d->ldo, 1, d->BQ, d->BK, d->HD, kk, 0);
    PW_PH_THREADS(t, pw_cu_fa_fwd_max(d, sm, tok, r0, c0, c0 > kbeg, t));
    PW_PH_THREADS(t, pw_cu_fa_fwd_exp(d, sm, tok, r0, c0, t));
    /* O += P V */
    if (d->bf16)
      PW_PH_WARPS(w, pw_cu_fa_mm_bf16(w, PW_FA_F(sm, d->o_a1), d->lda, PW_FA_H(sm, d->o_pb), d->ldp, 0,
                                      PW_FA_H(sm, d->o_v), d->ldo, 0, d->BQ, on, d->BK, 1));
    else
      PW_PH_THREADS(t, pw_cu_fa_mm_f32(t, PW_FA_F(sm, d->o_a1), d->lda, PW_FA_F(sm, d->o_s), d->lds, 0,
                                       PW_FA_F(sm, d->o_v), d->ldo, 0, d->BQ, on, cols, 1));
  }
  PW_PH_THREADS(t, pw_cu_fa_fwd_store(d, sm, out + pw_cu_fa_o(d, b, h, r0), lse + ((size_t)b * d->NH + h) * d->T + r0,
                                      rows, kend > kbeg, t));
}

/* ---- backward ----------------------------------------------------------------------- */

/* D (B, NH, T) element idx = (b NH + h) T + r: dout . out of row r of
 * head h of sequence b, float32 in order (ops_flash.c's D; the backward's
 * first launch, a thread a row). */
static inline PW_HD void pw_cu_fa_d_row(const pw_cu_fa *d, float *D, const float *dout, const float *out, size_t idx) {
  int r = (int)(idx % (size_t)d->T);
  size_t bh = idx / (size_t)d->T;
  int h = (int)(bh % (size_t)d->NH), b = (int)(bh / (size_t)d->NH);
  const float *x = dout + pw_cu_fa_o(d, b, h, r), *y = out + pw_cu_fa_o(d, b, h, r);
  float s = 0.0f;
  for (int c = 0; c < d->HD; c++) s += x[c] * y[c];
  D[idx] = s;
}
static inline PW_HD size_t pw_cu_fa_d_n(const pw_cu_fa *d) { return (size_t)d->B * d->NH * d->T; }

/* Thread t's part of staging a query tile for the backward: Q and dO, and
 * per row lse, D (0 past the rows) and the uniform flag. */
PW_PH_FN void pw_cu_fa_bwd_rows(const pw_cu_fa *d, unsigned char *sm, const float *qkv, const float *dout,
                                const float *lse, int b, int h, int r0, int t) {
  int rows = pw_cu_fa_min(d->BQ, d->T - r0);
  pw_cu_fa_load(d, sm, d->o_q, qkv, d->qkvb, pw_cu_fa_q(d, b, h, r0), d->W, rows, d->BQ, t);
  pw_cu_fa_load(d, sm, d->o_do, dout, d->doutb, pw_cu_fa_o(d, b, h, r0), (size_t)d->C, rows, d->BQ, t);
  pw_cu_fa_rows_u(d, sm, pw_cu_fa_tok(d, b), r0, t);
  size_t at = ((size_t)b * d->NH + h) * d->T + r0;
  for (int i = t; i < d->BQ; i += PW_FA_NT) {
    PW_FA_F(sm, d->o_r1)[i] = i < rows ? lse[at + i] : 0.0f;
    PW_FA_F(sm, d->o_r2)[i] = i < rows ? d->D[at + i] : 0.0f;
  }
}

/* From S = Q K^T and dP = dO V^T of query rows r0.. and keys c0..: P =
 * exp(scale s - lse) where the row sees the key (else 0; a uniform row's s
 * 0), dS = P (dP - D) (0 in a uniform row: its scores were constants).
 * float32: P into S, dS into dP; bf16: bf16(P) into the P tile (when the
 * kernel has one) and bf16(scale dS) into the dS tile. */
PW_PH_FN void pw_cu_fa_bwd_ds(const pw_cu_fa *d, unsigned char *sm, const int32_t *tok, int r0, int c0, int t) {
  float *S = PW_FA_F(sm, d->o_s), *dP = PW_FA_F(sm, d->o_dp);
  const float *L = PW_FA_F(sm, d->o_r1), *D = PW_FA_F(sm, d->o_r2), *U = PW_FA_F(sm, d->o_ru);
  PW_FA_EACH(t, d->BQ, d->BK, i, j, {
    int at = i * d->lds + j, u = U[i] != 0.0f;
    float s_ = u ? 0.0f : S[at] * d->scale;
    float p = pw_cu_fa_sees(d, tok, r0 + i, c0 + j, u) ? PW_FA_EXP(d, s_ - L[i]) : 0.0f;
    float ds = u ? 0.0f : p * (dP[at] - D[i]);
    if (d->bf16) {
      if (d->o_pb) PW_FA_H(sm, d->o_pb)[i * d->ldp + j] = pw_cu_bf16_bits(p);
      PW_FA_H(sm, d->o_dsb)[i * d->ldp + j] = pw_cu_bf16_bits(ds * d->scale);
    } else {
      S[at] = p;
      dP[at] = ds;
    }
  });
}

/* rows x HD of an accumulator tile into dst (row ld): (acc ? old : 0) +
 * f x, f the scale float32 dS still owes (1 for bf16 and for dV). */
PW_PH_FN void pw_cu_fa_store_grad(const pw_cu_fa *d, unsigned char *sm, unsigned o, float *dst, size_t ld, int rows,
                                  float f, int acc, int t) {
  const float *A = PW_FA_F(sm, o);
  PW_FA_EACH(t, rows, d->HD, i, c, {
    float g = f == 1.0f ? A[i * d->lda + c] : f * A[i * d->lda + c];
    float *x = dst + (size_t)i * ld + (size_t)c;
    *x = (acc ? *x : 0.0f) + g;
  });
}

/* S = Q K^T and dP = dO V^T of the staged tiles, one phase (the two
 * products read the same tiles and write their own). */
#define PW_FA_S_DP(d, sm, kk)                                                                                       \
  do {                                                                                                              \
    if ((d)->bf16)                                                                                                  \
      PW_PH_WARPS(w_, {                                                                                             \
        pw_cu_fa_mm_bf16(w_, PW_FA_F(sm, (d)->o_s), (d)->lds, PW_FA_H(sm, (d)->o_q), (d)->ldo, 0,                  \
                         PW_FA_H(sm, (d)->o_k), (d)->ldo, 1, (d)->BQ, (d)->BK, kk, 0);                              \
        pw_cu_fa_mm_bf16(w_, PW_FA_F(sm, (d)->o_dp), (d)->lds, PW_FA_H(sm, (d)->o_do), (d)->ldo, 0,                \
                         PW_FA_H(sm, (d)->o_v), (d)->ldo, 1, (d)->BQ, (d)->BK, kk, 0);                              \
      });                                                                                                           \
    else                                                                                                            \
      PW_PH_THREADS(t_, {                                                                                           \
        pw_cu_fa_mm_f32(t_, PW_FA_F(sm, (d)->o_s), (d)->lds, PW_FA_F(sm, (d)->o_q), (d)->ldo, 0,                   \
                        PW_FA_F(sm, (d)->o_k), (d)->ldo, 1, (d)->BQ, (d)->BK, (d)->HD, 0);                          \
        pw_cu_fa_mm_f32(t_, PW_FA_F(sm, (d)->o_dp), (d)->lds, PW_FA_F(sm, (d)->o_do), (d)->ldo, 0,                 \
                        PW_FA_F(sm, (d)->o_v), (d)->ldo, 1, (d)->BQ, (d)->BK, (d)->HD, 0);                          \
      });                                                                                                           \
  } while (0)

/* dq of query tile qt of head h of sequence b: dQ = sum over its key tiles
 * of dS K (float32: times scale at the end). */
PW_PH_FN void pw_cu_fa_dq_block(const pw_cu_fa *d, float *dqkv, const float *dout, const float *qkv,
                                const float *lse, int acc, int qt, int h, int b, unsigned char *sm) {
  int r0 = qt * d->BQ, rows = pw_cu_fa_min(d->BQ, d->T - r0), g = h / d->G;
  int kbeg = pw_cu_fa_lo(d, r0), kend = d->causal ? pw_cu_fa_min(d->T, r0 + d->BQ) : d->T;
  int kk = d->bf16 ? d->HDP : d->HD, on = d->bf16 ? d->HDP : d->HD;
  const int32_t *tok = pw_cu_fa_tok(d, b);
  PW_PH_THREADS(t, {
    pw_cu_fa_bwd_rows(d, sm, qkv, dout, lse, b, h, r0, t);
    pw_cu_fa_zero(sm, d->o_a1, d->BQ * d->lda, t);
  });
  for (int c0 = kbeg; c0 < kend; c0 += d->BK) {
    int cols = pw_cu_fa_min(d->BK, kend - c0);
    PW_PH_THREADS(t, {
      pw_cu_fa_load(d, sm, d->o_k, qkv, d->qkvb, pw_cu_fa_k(d, b, g, c0), d->W, cols, d->BK, t);
      pw_cu_fa_load(d, sm, d->o_v, qkv, d->qkvb, pw_cu_fa_v(d, b, g, c0), d->W, cols, d->BK, t);
    });
    PW_FA_S_DP(d, sm, kk);
    PW_PH_THREADS(t, pw_cu_fa_bwd_ds(d, sm, tok, r0, c0, t));
    /* dQ += dS K */
    if (d->bf16)
      PW_PH_WARPS(w, pw_cu_fa_mm_bf16(w, PW_FA_F(sm, d->o_a1), d->lda, PW_FA_H(sm, d->o_dsb), d->ldp, 0,
                                      PW_FA_H(sm, d->o_k), d->ldo, 0, d->BQ, on, d->BK, 1));
    else
      PW_PH_THREADS(t, pw_cu_fa_mm_f32(t, PW_FA_F(sm, d->o_a1), d->lda, PW_FA_F(sm, d->o_dp), d->lds, 0,
                                       PW_FA_F(sm, d->o_k), d->ldo, 0, d->BQ, on, cols, 1));
  }
  PW_PH_THREADS(t, pw_cu_fa_store_grad(d, sm, d->o_a1, dqkv + pw_cu_fa_q(d, b, h, r0), d->W, rows,
                                       d->bf16 ? 1.0f : d->scale, acc, t));
}

/* dk and dv of key tile kt of kv head g of sequence b: over the query
 * heads of its group in order and their query tiles that see the tile, dV
 * += P^T dO and dK += dS^T Q (float32: times scale at the end). */
PW_PH_FN void pw_cu_fa_dkv_block(const pw_cu_fa *d, float *dqkv, const float *dout, const float *qkv,
                                 const float *lse, int acc, int kt, int g, int b, unsigned char *sm) {
  int c0 = kt * d->BK, cols = pw_cu_fa_min(d->BK, d->T - c0);
  int kk = d->bf16 ? d->HDP : d->HD, on = d->bf16 ? d->HDP : d->HD;
  /* the query tiles that see the key tile: causal, from key c0's row on;
   * a window, to the row whose window the tile's last key leaves */
  int q0 = d->causal ? c0 / d->BQ : 0, q1 = pw_cu_fa_tiles(d->T, d->BQ);
  int qw = (c0 + cols - 1 + d->window - 1) / d->BQ + 1; /* past the last row whose window holds the tile */
  if (d->window > 0 && qw < q1) q1 = qw;
  const int32_t *tok = pw_cu_fa_tok(d, b);
  PW_PH_THREADS(t, {
    pw_cu_fa_load(d, sm, d->o_k, qkv, d->qkvb, pw_cu_fa_k(d, b, g, c0), d->W, cols, d->BK, t);
    pw_cu_fa_load(d, sm, d->o_v, qkv, d->qkvb, pw_cu_fa_v(d, b, g, c0), d->W, cols, d->BK, t);
    pw_cu_fa_zero(sm, d->o_a1, d->BK * d->lda, t);
    pw_cu_fa_zero(sm, d->o_a2, d->BK * d->lda, t);
  });
  for (int h = g * d->G; h < (g + 1) * d->G; h++)
    for (int qt = q0; qt < q1; qt++) {
      int r0 = qt * d->BQ, rows = pw_cu_fa_min(d->BQ, d->T - r0);
      PW_PH_THREADS(t, pw_cu_fa_bwd_rows(d, sm, qkv, dout, lse, b, h, r0, t));
      PW_FA_S_DP(d, sm, kk);
      PW_PH_THREADS(t, pw_cu_fa_bwd_ds(d, sm, tok, r0, c0, t));
      /* dV += P^T dO;  dK += dS^T Q */
      if (d->bf16) {
        PW_PH_WARPS(w, {
          pw_cu_fa_mm_bf16(w, PW_FA_F(sm, d->o_a2), d->lda, PW_FA_H(sm, d->o_pb), d->ldp, 1, PW_FA_H(sm, d->o_do),
                           d->ldo, 0, d->BK, on, d->BQ, 1);
          pw_cu_fa_mm_bf16(w, PW_FA_F(sm, d->o_a1), d->lda, PW_FA_H(sm, d->o_dsb), d->ldp, 1, PW_FA_H(sm, d->o_q),
                           d->ldo, 0, d->BK, on, d->BQ, 1);
        });
      } else {
        PW_PH_THREADS(t, {
          pw_cu_fa_mm_f32(t, PW_FA_F(sm, d->o_a2), d->lda, PW_FA_F(sm, d->o_s), d->lds, 1, PW_FA_F(sm, d->o_do),
                          d->ldo, 0, d->BK, on, rows, 1);
          pw_cu_fa_mm_f32(t, PW_FA_F(sm, d->o_a1), d->lda, PW_FA_F(sm, d->o_dp), d->lds, 1, PW_FA_F(sm, d->o_q),
                          d->ldo, 0, d->BK, on, rows, 1);
        });
      }
    }
  PW_PH_THREADS(t, {
    pw_cu_fa_store_grad(d, sm, d->o_a1, dqkv + pw_cu_fa_k(d, b, g, c0), d->W, cols, d->bf16 ? 1.0f : d->scale, acc, t);
    pw_cu_fa_store_grad(d, sm, d->o_a2, dqkv + pw_cu_fa_v(d, b, g, c0), d->W, cols, 1.0f, acc, t);
  });
}

#endif

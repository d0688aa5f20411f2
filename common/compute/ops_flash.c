/* ops_flash: attention without the T x T buffer — tiled, with an online
 * softmax (the FlashAttention-2 algorithm). Contracts in ops_flash.h (the
 * general entry) and ops.h / bf16.h (pw_attention_tiled_*).
 *
 * Forward: each block of PW_ATTN_TILE_Q query rows walks the key tiles of
 * PW_ATTN_TILE_K keys it sees (causal: none above the diagonal; a sliding
 * window: none before its first row's window; pad keys -inf), keeping a
 * running max m and sum l per row; the output block is rescaled by
 * exp(m_old - m_new) before each tile's P V is added, and divided by l at
 * the end. Only each row's log-sum-exp m + log l is saved (B, NH, T).
 * Backward: each key tile keeps its dK and dV sums in the work buffer and
 * walks the query rows that see it in blocks of PW_ATTN_TILE_B (64 where
 * they cross the diagonal), recomputing P = exp(s - lse) tile by tile from
 * q, k and the saved lse, with D = rowsum(dO * O) per row computed once per
 * head: dS = P * (dP - D). dQ is added into place tile after tile. Five
 * products a tile against the plain backward's four: the forward's gain
 * (its exponentials in float, its tiles in cache) pays for it from T about
 * 4 to 6 head widths on (bench/results/attention/).
 *
 * Deterministic: every sum runs in a fixed order (the tiles in order, one
 * thread of sgemm per call as everywhere), so a pipelined run still equals
 * the single process bit for bit. Tile sizes: the forward's 64 x 128 score
 * tile is 32 KiB, its Q, K and V tiles of HD 64 another 80 KiB; the
 * backward's two 256 x 128 tiles 256 KiB: L2. (Tried: 32 to 128 query
 * rows, 64 to 256 keys, 64 to 1024 backward rows; these were among the
 * fastest, the differences within the noise of a shared machine.)
 *
 * Never allocates. The elementwise tile loops are PW_CPU_DISPATCH
 * functions (cpu.h), the math ops_math.h's: pw__expf, the float exp (within
 * 1 ulp), not the plain softmax's correctly rounded double one, which took
 * 12 of the 90 ms of a d768 T 1024 backward. */
#include "ops_flash.h"

#include <math.h>
#include <string.h>

#include "cpu.h"
#include "gemm.h"
#include "log.h"
#include "ops.h"
#include "ops_math.h"
#include "optable.h"

#define TQ PW_ATTN_TILE_Q
#define TB PW_ATTN_TILE_B
#define TK PW_ATTN_TILE_K
_Static_assert(TB >= TQ, "the backward's tiles hold the forward's");

size_t pw__attn_work(int Tq, int HD, int NH, int NKV) {
  /* S and dS tiles, dK and dV sums of a key tile, D of a kv head's group */
  return 2 * (size_t)TB * TK + 2 * (size_t)TK * (size_t)HD + (size_t)(NH / NKV) * (size_t)Tq;
}

/* Keys query row r sees: [key_lo, seen). */
static inline int seen(const pw__attn *a, int r) {
  if (!a->causal) return a->Tk;
  return a->off + r + 1 < a->Tk ? a->off + r + 1 : a->Tk;
}
static inline int key_lo(const pw__attn *a, int r) { return pw__attn_first_key(a->off + r, a->window); }

/* Keys [z[i], n[i]) of tile [c0, c0 + cols) row r0 + i sees (0 .. cols);
 * e[i] 1: the row's keys are all pad (masked: with tok, pad keys). */
static void seen_in_tile(const pw__attn *a, const int32_t *tok, int r0, int rows, int c0, int cols, int *z, int *n,
                         uint8_t *e) {
  for (int i = 0; i < rows; i++) {
    int lo = key_lo(a, r0 + i), hi = seen(a, r0 + i), k = hi - c0, j = lo - c0;
    n[i] = k < 0 ? 0 : k > cols ? cols : k;
    z[i] = j < 0 ? 0 : j > n[i] ? n[i] : j;
    e[i] = (uint8_t)pw__attn_all_pad(tok, a->pad, lo, hi);
  }
}

/* The pad mask on a tile of scores (tok: the tile's keys' tokens): within
 * each row's keys a pad key's score is -inf, or every score 0 where the
 * row's keys are all pad (a uniform row). after: the same keys' exp to 0
 * (pw__expf(-inf) is e^-87, not 0). */
static void mask_tile(float *S, int rows, const int *z, const int *n, const uint8_t *e, const int32_t *tok,
                      int32_t pad, int after) {
  for (int i = 0; i < rows; i++) {
    float *p = S + (size_t)i * TK;
    for (int j = z[i]; j < n[i]; j++)
      if (e[i])
        p[j] = after ? p[j] : 0.0f;
      else if (tok[j] == pad)
        p[j] = after ? 0.0f : -INFINITY;
  }
}

/* exp then zero runs on to a whole number of PW_LANES within the tile: a
 * scalar tail of up to 15 exps costs more than whole vectors. */
static inline int lanes_up(int n, int cols) {
  int r = (n + PW_LANES - 1) / PW_LANES * PW_LANES;
  return r < cols ? r : cols;
}

/* ---- the tiles' elementwise parts ---------------------------------------- */

/* One step of the online softmax over a tile S (rows x cols, row length TK)
 * of scores; row i sees keys [z[i], n[i]) (tok set: less its pad keys, as
 * mask_tile). first: the row block's first tile. m[i] and l[i] move to the
 * new max and al[i] is the factor the output so far is rescaled by. S
 * becomes exp(s - m), zero outside the keys seen. A row that has seen only
 * masked keys so far has max -inf: exp then runs from 0 (and zeroes them).
 * Phase by phase over the rows, as ops_attn.c's softmax: the serial
 * chains of the rows overlap. online_exp: the new max mx and the exps;
 * online_sums (after mask_tile's zeros): the sums and rescale factors. */
static PW_CPU_DISPATCH(online_exp, (float *S, int rows, int cols, const int *z, const int *n, const float *m,
                                    float *mx, int first),
                       (S, rows, cols, z, n, m, mx, first)) {
  for (int i = 0; i < rows; i++) {
    float t = n[i] > z[i] ? pw__max(S + (size_t)i * TK + z[i], n[i] - z[i]) : m[i];
    mx[i] = first || isgreater(t, m[i]) ? t : m[i];
  }
  for (int i = 0; i < rows; i++) {
    float *p = S + (size_t)i * TK, x = mx[i] == -INFINITY ? 0.0f : mx[i];
    int e = z[i] + lanes_up(n[i] - z[i], cols - z[i]);
    if (z[i]) memset(p, 0, (size_t)z[i] * sizeof(float));
    for (int j = z[i]; j < e; j++) p[j] = pw__expf(p[j] - x);
    if (n[i] < cols) memset(p + n[i], 0, (size_t)(cols - n[i]) * sizeof(float));
  }
}

/* The online softmax's sums, after the pad mask zeroed its keys' exp. */
static PW_CPU_DISPATCH(online_sums, (const float *S, int rows, const int *n, float *m, float *l, float *al,
                                     const float *mx, int first),
                       (S, rows, n, m, l, al, mx, first)) {
  for (int i = 0; i < rows; i++) {
    float s = pw__sum(S + (size_t)i * TK, n[i]);
    if (first) {
      l[i] = s;
    } else {
      al[i] = m[i] == -INFINITY ? 0.0f : pw__expf(m[i] - mx[i]);
      l[i] = l[i] * al[i] + s;
    }
    m[i] = mx[i];
  }
}

/* S (rows x cols) of scores becomes P = exp(s - lse[i]) on keys [z[i],
 * n[i]), zero elsewhere. */
static PW_CPU_DISPATCH(tile_probs, (float *S, int rows, int cols, const int *z, const int *n, const float *lse),
                       (S, rows, cols, z, n, lse)) {
  for (int i = 0; i < rows; i++) {
    float *p = S + (size_t)i * TK, x = lse[i];
    int e = z[i] + lanes_up(n[i] - z[i], cols - z[i]);
    if (z[i]) memset(p, 0, (size_t)z[i] * sizeof(float));
    for (int j = z[i]; j < e; j++) p[j] = pw__expf(p[j] - x);
    if (n[i] < cols) memset(p + n[i], 0, (size_t)(cols - n[i]) * sizeof(float));
  }
}

/* dS = P * (dP - D[i]) in place on dS (rows x cols); where P is 0 (masked)
 * so is dS, and all of a uniform row's (e[i]: its scores were constants). */
static PW_CPU_DISPATCH(tile_dsoftmax, (float *dS, const float *P, int rows, int cols, const float *D,
                                       const uint8_t *e),
                       (dS, P, rows, cols, D, e)) {
  for (int i = 0; i < rows; i++) {
    float *d = dS + (size_t)i * TK, di = D[i];
    const float *p = P + (size_t)i * TK;
    if (e[i])
      memset(d, 0, (size_t)cols * sizeof(float));
    else
      for (int j = 0; j < cols; j++) d[j] = p[j] * (d[j] - di);
  }
}

/* rows x HD of x (row length ld) times f[i] per row. */
static PW_CPU_DISPATCH(scale_rows_by, (float *x, size_t ld, int rows, int HD, const float *f), (x, ld, rows, HD, f)) {
  for (int i = 0; i < rows; i++) {
    float *r = x + (size_t)i * ld, s = f[i];
    for (int e = 0; e < HD; e++) r[e] *= s;
  }
}

/* rows x cols of the tile (row length TK) times s. */
static void scale_tile(float *S, int rows, int cols, float s) {
  for (int i = 0; i < rows; i++)
    for (int j = 0; j < cols; j++) S[(size_t)i * TK + j] *= s;
}

static void tile_to_bf16(pw_bf16 *dst, const float *S, int rows, int cols) {
  for (int i = 0; i < rows; i++) pw_bf16_from_f32(dst + (size_t)i * TK, S + (size_t)i * TK, (size_t)cols);
}

/* ---- one head ------------------------------------------------------------ */

/* One query head of one sequence against its key/value head: pointers at
 * the head's first row (the bf16 ones NULL for float32 products). */
typedef struct {
  const float *q, *k, *v;
  const pw_bf16 *qb, *kb, *vb;
  const int32_t *tok; /* the sequence's key tokens (pad mask), or NULL */
  float *o, *lse;
} fwd_head;

static void forward_head(const pw__attn *a, const fwd_head *h, float scale, float *S, pw_bf16 *pb) {
  int HD = a->HD, ldq = (int)a->ldq, ldk = (int)a->ldk, ldo = (int)a->ldo;
  float m[TQ], l[TQ], al[TQ], mx[TQ];
  int z[TQ], n[TQ];
  uint8_t e[TQ];
  for (int r0 = 0; r0 < a->Tq; r0 += TQ) {
    int rows = a->Tq - r0 < TQ ? a->Tq - r0 : TQ;
    /* keys the block sees: from its first row's first to its last row's last */
    int kbeg = key_lo(a, r0), kend = seen(a, r0 + rows - 1);
    float *ob = h->o + (size_t)r0 * a->ldo;
    for (int i = 0; i < rows; i++) m[i] = -INFINITY, l[i] = 0.0f;
    for (int c0 = kbeg; c0 < kend; c0 += TK) {
      int cols = kend - c0 < TK ? kend - c0 : TK, first = c0 == kbeg;
      seen_in_tile(a, h->tok, r0, rows, c0, cols, z, n, e);
      /* S = scale Q[r0:] K[c0:]^T */
      if (h->qb) {
        pw_gemm_bf16(0, 1, rows, cols, HD, h->qb + (size_t)r0 * a->ldq, ldq, h->kb + (size_t)c0 * a->ldk, ldk, 0, S,
                     TK);
        scale_tile(S, rows, cols, scale);
      } else {
        pw_sgemm(0, 1, rows, cols, HD, scale, h->q + (size_t)r0 * a->ldq, ldq, h->k + (size_t)c0 * a->ldk, ldk, 0.0f,
                 S, TK);
      }
      if (h->tok) mask_tile(S, rows, z, n, e, h->tok + c0, a->pad, 0);
      online_exp(S, rows, cols, z, n, m, mx, first);
      if (h->tok) mask_tile(S, rows, z, n, e, h->tok + c0, a->pad, 1);
      online_sums(S, rows, n, m, l, al, mx, first);
      if (!first) scale_rows_by(ob, a->ldo, rows, HD, al);
      /* O[r0:] (+)= P V[c0:] */
      if (h->qb) {
        tile_to_bf16(pb, S, rows, cols);
        pw_gemm_bf16(0, 0, rows, HD, cols, pb, TK, h->vb + (size_t)c0 * a->ldk, ldk, !first, ob, ldo);
      } else {
        pw_sgemm(0, 0, rows, HD, cols, 1.0f, S, TK, h->v + (size_t)c0 * a->ldk, ldk, first ? 0.0f : 1.0f, ob, ldo);
      }
    }
    for (int i = 0; i < rows; i++) al[i] = 1.0f / l[i];
    scale_rows_by(ob, a->ldo, rows, HD, al);
    if (h->lse)
      for (int i = 0; i < rows; i++) h->lse[r0 + i] = m[i] + logf(l[i]);
  }
}

void pw__attn_forward(const pw__attn *a, float *o, float *lse, float *work, pw_bf16 *bwork) {
  PW_ASSERT(a->NKV > 0 && a->NH % a->NKV == 0 && a->HD > 0 && a->Tq > 0 && a->Tk > 0 && a->off >= 0);
  PW_ASSERT(!a->causal || a->off + a->Tq <= a->Tk);
  PW_ASSERT(a->window >= 0 && (!a->window || a->causal));
  float scale = 1.0f / sqrtf((float)a->HD);
  int G = a->NH / a->NKV;
  for (int b = 0; b < a->B; b++)
    for (int hq = 0; hq < a->NH; hq++) {
      size_t qo = (size_t)b * a->sq + (size_t)hq * a->HD, ko = (size_t)b * a->sk + (size_t)(hq / G) * a->HD;
      fwd_head h = {.q = a->q + qo, .k = a->k + ko, .v = a->v + ko,
                    .o = o + (size_t)b * a->so + (size_t)hq * a->HD,
                    .lse = lse ? lse + ((size_t)b * a->NH + hq) * a->Tq : NULL,
                    .tok = a->tok ? a->tok + (size_t)b * a->stok : NULL};
      if (a->qb) h.qb = a->qb + qo, h.kb = a->kb + ko, h.vb = a->vb + ko;
      forward_head(a, &h, scale, work, bwork);
    }
}

/* ---- backward ------------------------------------------------------------ */

/* One query head of the group a key/value head serves, for the backward. */
typedef struct {
  const float *q, *o, *dout, *lse;
  const pw_bf16 *qb, *dob;
  const int32_t *tok; /* the sequence's key tokens (pad mask), or NULL */
  float *dq, *D; /* D (Tq): rowsum(dO * O) */
} bwd_head;

/* Key tile [c0, c0 + cols) of one key/value head against query head h's
 * blocks that see it: adds into dK and dV's sums (cols x HD) and into dq. */
static void backward_tile(const pw__attn *a, const bwd_head *h, const float *k, const float *v, const pw_bf16 *kb,
                          const pw_bf16 *vb, int c0, int cols, float scale, float beta_q, float *work, pw_bf16 *bwork) {
  int HD = a->HD, ldq = (int)a->ldq, ldk = (int)a->ldk, ldo = (int)a->ldo;
  float *S = work, *dS = work + (size_t)TB * TK;
  float *dK = dS + (size_t)TB * TK, *dV = dK + (size_t)TK * HD;
  pw_bf16 *pb = bwork, *dsb = bwork ? bwork + (size_t)TB * TK : NULL;
  int z[TB], n[TB];
  uint8_t e[TB];
  int first = a->causal && c0 > a->off ? c0 - a->off : 0; /* the first query row that sees key c0 */
  int last = a->Tq;                                       /* and past the last (a window) */
  if (a->window && c0 + cols + a->window - 1 - a->off < last) last = c0 + cols + a->window - 1 - a->off;
  for (int r0 = first, rows; r0 < last; r0 += rows) {
    /* TQ rows while the rows see only part of the tile (the masked
     * triangle is computed for nothing: TK^2/2 a tile at TB rows, a
     * third of a T 256 backward's products), TB after */
    rows = a->causal && r0 < first + TK ? TQ : TB;
    rows = last - r0 < rows ? last - r0 : rows;
    int ce = seen(a, r0 + rows - 1) - c0; /* the forward's tile: keys the block sees */
    ce = ce < cols ? ce : cols;
    seen_in_tile(a, h->tok, r0, rows, c0, ce, z, n, e);
    const float *qi = h->q + (size_t)r0 * a->ldq, *doi = h->dout + (size_t)r0 * a->ldo;
    float *dqi = h->dq + (size_t)r0 * a->ldq;
    /* P = exp(scale Q K^T - lse), recomputed */
    if (h->qb) {
      pw_gemm_bf16(0, 1, rows, ce, HD, h->qb + (size_t)r0 * a->ldq, ldq, kb, ldk, 0, S, TK);
      scale_tile(S, rows, ce, scale);
    } else {
      pw_sgemm(0, 1, rows, ce, HD, scale, qi, ldq, k, ldk, 0.0f, S, TK);
    }
    if (h->tok) mask_tile(S, rows, z, n, e, h->tok + c0, a->pad, 0);
    tile_probs(S, rows, ce, z, n, h->lse + r0);
    if (h->tok) mask_tile(S, rows, z, n, e, h->tok + c0, a->pad, 1);
    /* dV += P^T dO;  dP = dO V^T */
    if (h->qb) {
      const pw_bf16 *dobi = h->dob + (size_t)r0 * a->ldo;
      tile_to_bf16(pb, S, rows, ce);
      pw_gemm_bf16(1, 0, ce, HD, rows, pb, TK, dobi, ldo, 1, dV, HD);
      pw_gemm_bf16(0, 1, rows, ce, HD, dobi, ldo, vb, ldk, 0, dS, TK);
    } else {
      pw_sgemm(1, 0, ce, HD, rows, 1.0f, S, TK, doi, ldo, 1.0f, dV, HD);
      pw_sgemm(0, 1, rows, ce, HD, 1.0f, doi, ldo, v, ldk, 0.0f, dS, TK);
    }
    tile_dsoftmax(dS, S, rows, ce, h->D + r0, e);
    /* dQ (+)= scale dS K;  dK += scale dS^T Q */
    if (h->qb) {
      scale_tile(dS, rows, ce, scale);
      tile_to_bf16(dsb, dS, rows, ce);
      pw_gemm_bf16(0, 0, rows, HD, ce, dsb, TK, kb, ldk, beta_q != 0.0f, dqi, ldq);
      pw_gemm_bf16(1, 0, ce, HD, rows, dsb, TK, h->qb + (size_t)r0 * a->ldq, ldq, 1, dK, HD);
    } else {
      pw_sgemm(0, 0, rows, HD, ce, scale, dS, TK, k, ldk, beta_q, dqi, ldq);
      pw_sgemm(1, 0, ce, HD, rows, scale, dS, TK, qi, ldq, 1.0f, dK, HD);
    }
  }
}

/* rows x HD of dst (row length ld) (+)= src (row length HD). */
static PW_CPU_DISPATCH(store_rows, (float *dst, size_t ld, const float *src, int rows, int HD, int acc),
                       (dst, ld, src, rows, HD, acc)) {
  for (int i = 0; i < rows; i++) {
    float *d = dst + (size_t)i * ld;
    const float *s = src + (size_t)i * HD;
    for (int e = 0; e < HD; e++) d[e] = pw__acc(acc, d[e], s[e]);
  }
}

/* Query head t of key/value head g's group in sequence b. */
static bwd_head head_of(const pw__attn *a, int b, int g, int t, float *dq, const float *dout, const float *o,
                        const float *lse, float *D) {
  int hq = g * (a->NH / a->NKV) + t;
  size_t qo = (size_t)b * a->sq + (size_t)hq * a->HD, oo = (size_t)b * a->so + (size_t)hq * a->HD;
  bwd_head h = {.q = a->q + qo, .o = o + oo, .dout = dout + oo, .lse = lse + ((size_t)b * a->NH + hq) * a->Tq,
                .dq = dq + qo, .D = D + (size_t)t * a->Tq, .tok = a->tok ? a->tok + (size_t)b * a->stok : NULL};
  if (a->qb) h.qb = a->qb + qo, h.dob = a->dob + oo;
  return h;
}

void pw__attn_backward(const pw__attn *a, float *dq, float *dk, float *dv, const float *dout, const float *o,
                       const float *lse, int acc, float *work, pw_bf16 *bwork) {
  PW_ASSERT(a->NKV > 0 && a->NH % a->NKV == 0 && a->HD > 0 && a->Tq > 0 && a->Tk > 0 && a->off >= 0);
  PW_ASSERT(!a->causal || a->off + a->Tq <= a->Tk);
  PW_ASSERT(a->window >= 0 && (!a->window || a->causal));
  int HD = a->HD, G = a->NH / a->NKV;
  /* a window: key tile 0 is not every query row's, so dq is zeroed first
   * and every tile adds */
  int zero_dq = a->window > 0 && !acc;
  float scale = 1.0f / sqrtf((float)HD);
  float *dK = work + 2 * (size_t)TB * TK, *D = dK + 2 * (size_t)TK * HD;
  for (int b = 0; b < a->B; b++)
    for (int g = 0; g < a->NKV; g++) {
      size_t ko = (size_t)b * a->sk + (size_t)g * HD;
      for (int t = 0; t < G; t++) {
        bwd_head h = head_of(a, b, g, t, dq, dout, o, lse, D);
        for (int r = 0; r < a->Tq; r++) {
          h.D[r] = pw__dot(h.dout + (size_t)r * a->ldo, h.o + (size_t)r * a->ldo, HD);
          if (zero_dq) memset(h.dq + (size_t)r * a->ldq, 0, (size_t)HD * sizeof(float));
        }
      }
      for (int c0 = 0; c0 < a->Tk; c0 += TK) {
        int cols = a->Tk - c0 < TK ? a->Tk - c0 : TK;
        size_t kc = ko + (size_t)c0 * a->ldk;
        memset(dK, 0, 2 * (size_t)TK * HD * sizeof(float)); /* dK and dV */
        /* dq's first writer is key tile 0, which every query row sees
         * (without a window) */
        float beta_q = c0 || acc || zero_dq ? 1.0f : 0.0f;
        for (int t = 0; t < G; t++) {
          bwd_head h = head_of(a, b, g, t, dq, dout, o, lse, D);
          backward_tile(a, &h, a->k + kc, a->v + kc, a->qb ? a->kb + kc : NULL, a->qb ? a->vb + kc : NULL, c0, cols,
                        scale, beta_q, work, bwork);
        }
        store_rows(dk + kc, a->ldk, dK, cols, HD, acc);
        store_rows(dv + kc, a->ldk, dK + (size_t)TK * HD, cols, HD, acc);
      }
    }
}

/* ---- grouped-query attention on a packed qkv (ops.h, bf16.h) ------------- */

static pw__attn packed(const float *qkv, int B, int T, int C, int NH, int NKV, const pw_attn_mask *mk) {
  PW_ASSERT(NH > 0 && C % NH == 0 && NKV > 0 && NH % NKV == 0);
  int HD = C / NH;
  size_t W = (size_t)C + 2 * (size_t)NKV * HD;
  pw__attn a = {.B = B, .Tq = T, .Tk = T, .NH = NH, .NKV = NKV, .HD = HD, .off = 0, .causal = 1,
                .q = qkv, .k = qkv + C, .v = qkv + C + (size_t)NKV * HD, .ldq = W, .ldk = W, .ldo = (size_t)C,
                .sq = (size_t)T * W, .sk = (size_t)T * W, .so = (size_t)T * C};
  if (mk) a.causal = !mk->bidir, a.window = mk->window, a.tok = mk->tok, a.stok = (size_t)T, a.pad = mk->pad;
  return a;
}

/* Where k and v begin in a packed row. */
static size_t kv_at(int C, int NH, int NKV) { return (size_t)NKV * (size_t)(C / NH); }

size_t pw_attention_tiled_scratch(int T, int C, int NH, int NKV) { return pw__attn_work(T, C / NH, NH, NKV); }

void pw_attention_tiled_forward_mask(float *out, float *lse, float *scratch, const float *qkv, int B, int T, int C,
                                     int NH, int NKV, const pw_attn_mask *mk) {
  pw__attn a = packed(qkv, B, T, C, NH, NKV, mk);
  pw__attn_forward(&a, out, lse, scratch, NULL);
}

void pw_attention_tiled_forward(float *out, float *lse, float *scratch, const float *qkv, int B, int T, int C,
                                int NH, int NKV) {
  pw_attention_tiled_forward_mask(out, lse, scratch, qkv, B, T, C, NH, NKV, NULL);
}

void pw_attention_tiled_backward_input_mask(float *dqkv, float *scratch, const float *dout, const float *out,
                                            const float *qkv, const float *lse, int B, int T, int C, int NH, int NKV,
                                            int acc, const pw_attn_mask *mk) {
  pw__attn a = packed(qkv, B, T, C, NH, NKV, mk);
  pw__attn_backward(&a, dqkv, dqkv + C, dqkv + C + kv_at(C, NH, NKV), dout, out, lse, acc, scratch, NULL);
}

void pw_attention_tiled_backward_input(float *dqkv, float *scratch, const float *dout, const float *out,
                                       const float *qkv, const float *lse, int B, int T, int C, int NH, int NKV,
                                       int acc) {
  pw_attention_tiled_backward_input_mask(dqkv, scratch, dout, out, qkv, lse, B, T, C, NH, NKV, acc, NULL);
}

/* bs: qkv as bf16 (B*T*W), then dout's (B*T*C; the backward), then the P
 * and dS tiles (2 TB*TK): within pw_attention_tiled_bf16_scratch. */
void pw_attention_tiled_forward_bf16_mask(float *out, float *lse, float *scratch, pw_bf16 *bs, const float *qkv,
                                          int B, int T, int C, int NH, int NKV, const pw_attn_mask *mk) {
  pw__attn a = packed(qkv, B, T, C, NH, NKV, mk);
  size_t n = (size_t)B * a.sq;
  pw_bf16_from_f32(bs, qkv, n);
  a.qb = bs, a.kb = bs + C, a.vb = bs + C + kv_at(C, NH, NKV);
  pw__attn_forward(&a, out, lse, scratch, bs + n + (size_t)B * T * C);
}

void pw_attention_tiled_forward_bf16(float *out, float *lse, float *scratch, pw_bf16 *bs, const float *qkv, int B,
                                     int T, int C, int NH, int NKV) {
  pw_attention_tiled_forward_bf16_mask(out, lse, scratch, bs, qkv, B, T, C, NH, NKV, NULL);
}

void pw_attention_tiled_backward_input_bf16_mask(float *dqkv, float *scratch, pw_bf16 *bs, const float *dout,
                                                 const float *out, const float *qkv, const float *lse, int B, int T,
                                                 int C, int NH, int NKV, int acc, const pw_attn_mask *mk) {
  pw__attn a = packed(qkv, B, T, C, NH, NKV, mk);
  size_t n = (size_t)B * a.sq, no = (size_t)B * T * C, kv = kv_at(C, NH, NKV);
  pw_bf16_from_f32(bs, qkv, n);
  pw_bf16_from_f32(bs + n, dout, no);
  a.qb = bs, a.kb = bs + C, a.vb = bs + C + kv, a.dob = bs + n;
  pw__attn_backward(&a, dqkv, dqkv + C, dqkv + C + kv, dout, out, lse, acc, scratch, bs + n + no);
}

void pw_attention_tiled_backward_input_bf16(float *dqkv, float *scratch, pw_bf16 *bs, const float *dout,
                                            const float *out, const float *qkv, const float *lse, int B, int T,
                                            int C, int NH, int NKV, int acc) {
  pw_attention_tiled_backward_input_bf16_mask(dqkv, scratch, bs, dout, out, qkv, lse, B, T, C, NH, NKV, acc, NULL);
}

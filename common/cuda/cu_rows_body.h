/* cu_rows_body: the norms' row kernels (layernorm and rmsnorm, forward and
 * backward_input) and cross-entropy's forward as block programs (cu_phase.h): a row to a group of 16
 * lanes, 16 rows a block, so that a row's loads are 16 neighbouring floats
 * at a time (one thread a row read 32 rows 3 KiB apart per load, and left
 * most of the GPU idle: layernorm's backward was 3 % of a float32 GPT-2
 * step).
 *
 * The CPU's bits all the same: ops.c sums a row in PW_LANES = 16 lanes
 * (lane l takes elements l, l + 16, ... of the part of the row a whole
 * number of 16 covers, in double), adds the lanes in order, then the tail;
 * the backwards do that chunk by chunk of PW_CU_CHUNK and add the chunks in
 * order (cu_ops_body.h's one-thread versions say the same). Here lane l of
 * the group is the CPU's lane l: its partial sum goes through shared
 * memory, and every lane of the group then adds the 16 partials and the
 * tail in the CPU's order itself (the same number in each), so nothing is
 * broadcast and nothing is summed in another order. tests/unit/
 * test_cu_emul.c runs these blocks and wants the CPU's bits.
 *
 * Shared memory: pw_cu_rows_smem() bytes, doubles. Must never: allocate,
 * touch global memory outside the arguments, or let a thread read in a
 * phase what another thread writes in it. */
#ifndef PW_CU_ROWS_BODY_H
#define PW_CU_ROWS_BODY_H

#include <math.h>
#include <stddef.h>

#include "cu_ops_body.h"
#include "cu_phase.h"

#define PW_RW_LANES PW_CU_LANES              /* a row's lanes: the CPU's */
#define PW_RW_ROWS (PW_PH_NT / PW_RW_LANES)  /* rows a block */

/* Four doubles a thread: two partial sums, two running totals. */
static inline PW_HD size_t pw_cu_rows_smem(void) { return 4 * (size_t)PW_PH_NT * sizeof(double); }
static inline PW_HD int pw_cu_rows_blocks(int N) { return (N + PW_RW_ROWS - 1) / PW_RW_ROWS; }

#define PW_RW_D(sm, k) ((double *)(sm) + (size_t)(k) * PW_PH_NT)

/* The sum of the group's 16 partials at P (thread t's group), in lane order. */
static inline PW_HD double pw_cu__group_sum(const double *P, int t) {
  const double *p = P + (t / PW_RW_LANES) * PW_RW_LANES;
  double r = 0;
  for (int l = 0; l < PW_RW_LANES; l++) r += p[l];
  return r;
}

/* ---- layernorm ---------------------------------------------------------------------- */

/* Block blk's rows of pw_layernorm_forward: mean = sum / C, var the mean
 * squared deviation from it (both double, in lanes), out = (x rs - m rs) w
 * + b; mean and rstd (float) saved. */
PW_PH_FN void pw_cu_layernorm_f_block(float *out, float *mean, float *rstd, const float *inp, const float *w,
                                      const float *b, int N, int C, float eps, int blk, unsigned char *sm) {
  int C16 = C - C % PW_RW_LANES;
  PW_PH_THREADS(t, {
    int n = blk * PW_RW_ROWS + t / PW_RW_LANES;
    double s = 0;
    if (n < N) {
      const float *x = inp + (size_t)n * (size_t)C;
      for (int j = t % PW_RW_LANES; j < C16; j += PW_RW_LANES) s += (double)x[j];
    }
    PW_RW_D(sm, 0)[t] = s;
  });
  PW_PH_THREADS(t, {
    int n = blk * PW_RW_ROWS + t / PW_RW_LANES;
    double s = 0;
    if (n < N) {
      const float *x = inp + (size_t)n * (size_t)C;
      double r = pw_cu__group_sum(PW_RW_D(sm, 0), t);
      for (int j = C16; j < C; j++) r += (double)x[j];
      double m = r / C;
      PW_RW_D(sm, 2)[t] = m;
      for (int j = t % PW_RW_LANES; j < C16; j += PW_RW_LANES) {
        double d = x[j] - m;
        s += d * d;
      }
    }
    PW_RW_D(sm, 1)[t] = s;
  });
  PW_PH_THREADS(t, {
    int n = blk * PW_RW_ROWS + t / PW_RW_LANES, l = t % PW_RW_LANES;
    if (n < N) {
      const float *x = inp + (size_t)n * (size_t)C;
      float *y = out + (size_t)n * (size_t)C;
      double m = PW_RW_D(sm, 2)[t], v = pw_cu__group_sum(PW_RW_D(sm, 1), t);
      for (int j = C16; j < C; j++) {
        double d = x[j] - m;
        v += d * d;
      }
      float mf = (float)m;
      float rs = 1.0f / sqrtf((float)(v / C) + eps);
      float shift = -mf * rs;
      for (int c = l; c < C; c += PW_RW_LANES) y[c] = (x[c] * rs + shift) * w[c] + b[c];
      if (l == 0) mean[n] = mf, rstd[n] = rs;
    }
  });
}

/* Block blk's rows of pw_layernorm_backward_input: sum(g) and sum(g xhat)
 * (g = dy w, xhat = (x - m) rs) chunk by chunk of PW_CU_CHUNK, each chunk
 * in lanes, the chunks added in order; dx (+)= rs (g - mean(g) - xhat
 * mean(g xhat)). */
PW_PH_FN void pw_cu_layernorm_i_block(float *dinp, const float *dout, const float *inp, const float *w,
                                      const float *mean, const float *rstd, int N, int C, int acc, int blk,
                                      unsigned char *sm) {
  for (int c0 = 0; c0 < C; c0 += PW_CU_CHUNK) {
    int len = C - c0 < PW_CU_CHUNK ? C - c0 : PW_CU_CHUNK, len16 = len - len % PW_RW_LANES;
    PW_PH_THREADS(t, {
      int n = blk * PW_RW_ROWS + t / PW_RW_LANES;
      double s = 0, q = 0;
      if (n < N) {
        size_t o = (size_t)n * (size_t)C + (size_t)c0;
        float m = mean[n], rs = rstd[n];
        for (int j = t % PW_RW_LANES; j < len16; j += PW_RW_LANES) {
          float g = dout[o + j] * w[c0 + j], xh = (inp[o + j] - m) * rs;
          s += (double)g;
          q += (double)g * xh;
        }
      }
      PW_RW_D(sm, 0)[t] = s, PW_RW_D(sm, 1)[t] = q;
      if (c0 == 0) PW_RW_D(sm, 2)[t] = PW_RW_D(sm, 3)[t] = 0;
    });
    PW_PH_THREADS(t, {
      int n = blk * PW_RW_ROWS + t / PW_RW_LANES;
      if (n < N) {
        size_t o = (size_t)n * (size_t)C + (size_t)c0;
        float m = mean[n], rs = rstd[n];
        double rg = pw_cu__group_sum(PW_RW_D(sm, 0), t), rgx = pw_cu__group_sum(PW_RW_D(sm, 1), t);
        for (int j = len16; j < len; j++) {
          float g = dout[o + j] * w[c0 + j], xh = (inp[o + j] - m) * rs;
          rg += (double)g;
          rgx += (double)g * xh;
        }
        PW_RW_D(sm, 2)[t] += rg;
        PW_RW_D(sm, 3)[t] += rgx;
      }
    });
  }
  PW_PH_THREADS(t, {
    int n = blk * PW_RW_ROWS + t / PW_RW_LANES;
    if (n < N) {
      size_t o = (size_t)n * (size_t)C;
      float m = mean[n], rs = rstd[n];
      float mg = (float)(PW_RW_D(sm, 2)[t] / C), mgx = (float)(PW_RW_D(sm, 3)[t] / C);
      for (int c = t % PW_RW_LANES; c < C; c += PW_RW_LANES) {
        float g = dout[o + c] * w[c], xh = (inp[o + c] - m) * rs;
        dinp[o + c] = pw_cu__accum(acc, dinp[o + c], rs * (g - mg - xh * mgx));
      }
    }
  });
}

/* ---- rmsnorm (off 0; Gemma's rmsnorm_offset: 1, the scale 1 + w) -------------------- */

/* Block blk's rows of pw_rmsnorm_offset_forward: rs from sum(x^2) (double,
 * in lanes), out = (off + w) (x rs), rstd saved. */
PW_PH_FN void pw_cu_rmsnorm_f_block(float *out, float *rstd, const float *inp, const float *w, float off, int N, int C,
                                    float eps, int blk, unsigned char *sm) {
  int C16 = C - C % PW_RW_LANES;
  PW_PH_THREADS(t, {
    int n = blk * PW_RW_ROWS + t / PW_RW_LANES;
    double s = 0;
    if (n < N) {
      const float *x = inp + (size_t)n * (size_t)C;
      for (int j = t % PW_RW_LANES; j < C16; j += PW_RW_LANES) s += (double)x[j] * x[j];
    }
    PW_RW_D(sm, 0)[t] = s;
  });
  PW_PH_THREADS(t, {
    int n = blk * PW_RW_ROWS + t / PW_RW_LANES, l = t % PW_RW_LANES;
    if (n < N) {
      const float *x = inp + (size_t)n * (size_t)C;
      float *y = out + (size_t)n * (size_t)C;
      double ss = pw_cu__group_sum(PW_RW_D(sm, 0), t);
      for (int j = C16; j < C; j++) ss += (double)x[j] * x[j];
      float rs = 1.0f / sqrtf((float)(ss / C) + eps);
      for (int c = l; c < C; c += PW_RW_LANES) y[c] = (off + w[c]) * (x[c] * rs);
      if (l == 0) rstd[n] = rs;
    }
  });
}

/* Block blk's rows of pw_rmsnorm_offset_backward_input: sum(g xhat) (g =
 * dy (off + w), xhat = x rs) chunk by chunk, each in lanes; dx (+)= rs (g -
 * xhat mean(g xhat)). */
PW_PH_FN void pw_cu_rmsnorm_i_block(float *dinp, const float *dout, const float *inp, const float *w, float off,
                                    const float *rstd, int N, int C, int acc, int blk, unsigned char *sm) {
  for (int c0 = 0; c0 < C; c0 += PW_CU_CHUNK) {
    int len = C - c0 < PW_CU_CHUNK ? C - c0 : PW_CU_CHUNK, len16 = len - len % PW_RW_LANES;
    PW_PH_THREADS(t, {
      int n = blk * PW_RW_ROWS + t / PW_RW_LANES;
      double q = 0;
      if (n < N) {
        size_t o = (size_t)n * (size_t)C + (size_t)c0;
        float rs = rstd[n];
        for (int j = t % PW_RW_LANES; j < len16; j += PW_RW_LANES) {
          float g = dout[o + j] * (off + w[c0 + j]), xh = inp[o + j] * rs;
          q += (double)g * xh;
        }
      }
      PW_RW_D(sm, 0)[t] = q;
      if (c0 == 0) PW_RW_D(sm, 2)[t] = 0;
    });
    PW_PH_THREADS(t, {
      int n = blk * PW_RW_ROWS + t / PW_RW_LANES;
      if (n < N) {
        size_t o = (size_t)n * (size_t)C + (size_t)c0;
        float rs = rstd[n];
        double r = pw_cu__group_sum(PW_RW_D(sm, 0), t);
        for (int j = len16; j < len; j++) {
          float g = dout[o + j] * (off + w[c0 + j]), xh = inp[o + j] * rs;
          r += (double)g * xh;
        }
        PW_RW_D(sm, 2)[t] += r;
      }
    });
  }
  PW_PH_THREADS(t, {
    int n = blk * PW_RW_ROWS + t / PW_RW_LANES;
    if (n < N) {
      size_t o = (size_t)n * (size_t)C;
      float rs = rstd[n], mgx = (float)(PW_RW_D(sm, 2)[t] / C);
      for (int c = t % PW_RW_LANES; c < C; c += PW_RW_LANES)
        dinp[o + c] = pw_cu__accum(acc, dinp[o + c], rs * (dout[o + c] * (off + w[c]) - (inp[o + c] * rs) * mgx));
    }
  });
}

/* ---- cross-entropy ------------------------------------------------------------------- */

/* Block blk's rows of pw_crossentropy_forward (cu_ops_body.h's
 * pw_cu_xent_f_row, 16 lanes a row): the max in lanes (each lane's from
 * the row's first logit, the lanes then in order, then the tail), p =
 * exp(x - max), their double sum in lanes, p times 1 / sum, and the row's
 * loss log(sum) - (x[target] - max) into rowloss. */
PW_PH_FN void pw_cu_xent_f_block(float *probs, double *rowloss, const float *logits, const int32_t *targets, int N,
                                 int V, int blk, unsigned char *sm) {
  int V16 = V - V % PW_RW_LANES;
  PW_PH_THREADS(t, {
    int n = blk * PW_RW_ROWS + t / PW_RW_LANES;
    float m = 0.0f;
    if (n < N) {
      const float *x = logits + (size_t)n * (size_t)V;
      m = x[0];
      for (int j = t % PW_RW_LANES; j < V16; j += PW_RW_LANES) m = x[j] > m ? x[j] : m;
    }
    PW_RW_D(sm, 0)[t] = m;
  });
  PW_PH_THREADS(t, {
    int n = blk * PW_RW_ROWS + t / PW_RW_LANES, l = t % PW_RW_LANES;
    double s = 0;
    if (n < N) {
      const float *x = logits + (size_t)n * (size_t)V;
      float *p = probs + (size_t)n * (size_t)V;
      const double *M = PW_RW_D(sm, 0) + (t / PW_RW_LANES) * PW_RW_LANES;
      float mx = (float)M[0];
      for (int k = 1; k < PW_RW_LANES; k++) mx = (float)M[k] > mx ? (float)M[k] : mx;
      for (int j = V16; j < V; j++) mx = x[j] > mx ? x[j] : mx;
      PW_RW_D(sm, 2)[t] = mx;
      for (int v = l; v < V; v += PW_RW_LANES) p[v] = pw_cu__exp(x[v] - mx);
      for (int j = l; j < V16; j += PW_RW_LANES) s += (double)p[j];
    }
    PW_RW_D(sm, 1)[t] = s;
  });
  PW_PH_THREADS(t, {
    int n = blk * PW_RW_ROWS + t / PW_RW_LANES, l = t % PW_RW_LANES;
    if (n < N) {
      const float *x = logits + (size_t)n * (size_t)V;
      float *p = probs + (size_t)n * (size_t)V;
      float mx = (float)PW_RW_D(sm, 2)[t];
      double sum = pw_cu__group_sum(PW_RW_D(sm, 1), t);
      /* the tail's p again (the same exp): their lanes scale them now */
      for (int j = V16; j < V; j++) sum += (double)pw_cu__exp(x[j] - mx);
      float inv = (float)(1.0 / sum);
      for (int v = l; v < V; v += PW_RW_LANES) p[v] *= inv;
      if (l == 0) rowloss[n] = log(sum) - ((double)x[targets[n]] - mx);
    }
  });
}

#endif

/* ops_moe: the kernels of a mixture-of-experts feed-forward (issue 38),
 * cut into ops that each do one thing, so that every backward splits into
 * its input half (I) and weight half (W) as the dense layers' do and the
 * experts' own activation is ops.h's SwiGLU (or GELU):
 *
 *   logits (N,E) = linear(x)                 the router's product (ops.h)
 *   r (N,2K)     = route(logits)             top-K experts of each token, weighted
 *   xs (N*K,C)   = dispatch(x, r)            each token copied to its K experts' rows
 *   hs (N*K,H)   = glinear(xs, r)            each row times its expert's matrix
 *   ...            (swiglu of two glinears, a third glinear back to C)
 *   y (N,C)      = combine(ys, r)            each token's K rows, weighted, summed
 *
 * r holds, for token n, the K gate weights r[n, 0..K) and the K expert ids
 * r[n, K..2K) (as floats: exact below 2^24), best first; ties go to the
 * lower expert index, so routing is a pure function of the logits. Only
 * the weights carry a gradient (combine's); the ids are constants to every
 * backward.
 *
 * The rows of xs, hs and ys are expert-major: expert e's (token, slot)
 * pairs at rows [off[e], off[e+1]), in ascending (n, k) order (row(n, k)
 * below). pw_moe_order makes off from r, in one pass; the kernels that
 * place pairs find their rows again from off in the same order, so
 * nothing the size of the microbatch is kept besides the values.
 * Each expert's rows are then one contiguous block: glinear is one sgemm
 * per expert, and every sum runs in a fixed order (bit-identical runs,
 * whatever the microbatching, as long as a microbatch is the same tokens).
 *
 * Same conventions as ops.h: backward_weight accumulates, backward_input
 * overwrites or adds per its acc flag, nothing allocates. */
#ifndef PW_OPS_MOE_H
#define PW_OPS_MOE_H

#include <stddef.h>

/* How gate weights come from the router's logits over the E experts. */
typedef enum {
  PW_MOE_SOFTMAX_TOPK, /* softmax over the K selected logits (Mixtral; Qwen-MoE's norm_topk_prob) */
  PW_MOE_SOFTMAX_ALL,  /* softmax over all E, the K selected kept as they are (Qwen2-MoE) */
  PW_MOE_SIGMOID,      /* DeepSeek-V3: s = sigmoid(logit); selected by s + bias; scale s / sum(selected s) */
} pw_moe_gate;

/* r (N,2K) from logits (N,E), as above. probs (N,E) saved for the
 * backward: softmax over all E (the softmax gates) or sigmoid(logits).
 * bias (E) or NULL: DeepSeek-V3's balance bias, added to the scores only to
 * choose (never to the weights; no gradient). scale: the SIGMOID gates'
 * routed scaling factor (1 elsewhere). 1 <= K <= E. */
void pw_moe_route_forward(float *r, float *probs, const float *logits, const float *bias, int N, int E, int K,
                          int gate, float scale);
/* dlogits (N,E) from the gradient of r's weight half (dr's id half is not
 * read); unselected experts get 0 under the top-K gates. */
void pw_moe_route_backward_input(float *dlogits, const float *dr, const float *r, const float *probs, int N, int E,
                                 int K, int gate, float scale, int acc);

/* off (E+1) of r's routing: expert e's block is rows [off[e], off[e+1]). */
void pw_moe_order(int *off, const float *r, int N, int E, int K);

/* xs[row(n, k)] = x[n]; x (N,C), xs (N*K,C). Backward: dx[n] = sum over k
 * (ascending) of dxs[row(n, k)]. cur: E ints of scratch (the pairs' rows
 * come from one cursor per expert, the pairs taken in (n, k) order). */
void pw_moe_dispatch_forward(float *xs, const float *x, const float *r, const int *off, int *cur, int N, int E, int K,
                             int C);
void pw_moe_dispatch_backward_input(float *dx, const float *dxs, const float *r, const int *off, int *cur, int N,
                                    int E, int K, int C, int acc);

/* Grouped linear: ys[i] = xs[i] @ w[e]^T for every row i of expert e's
 * block; xs (M,C), w (E,OC,C), ys (M,OC), M = off[E]. No bias. */
void pw_moe_glinear_forward(float *ys, const float *xs, const float *w, const int *off, int E, int C, int OC);
/* The same, one row at a time: a row's result does not depend on which
 * other rows share its expert (the decode's, whose calls mix sequences:
 * each sequence's logits are then those of its own call). */
void pw_moe_glinear_forward_rows(float *ys, const float *xs, const float *w, const int *off, int E, int C, int OC);
void pw_moe_glinear_backward_input(float *dxs, const float *dys, const float *w, const int *off, int E, int C, int OC,
                                   int acc);
void pw_moe_glinear_backward_weight(float *dw, const float *dys, const float *xs, const int *off, int E, int C,
                                    int OC);

/* y[n] = sum over k (ascending) of r[n,k] * ys[row(n, k)]; ys (N*K,C),
 * y (N,C). Backward: dys[row(n, k)] = r[n,k] dy[n] and dr[n,k] = dy[n] .
 * ys[row(n, k)] for the weights (dr's id half: + 0, i.e. 0 when
 * overwritten). cur as dispatch's. */
void pw_moe_combine_forward(float *y, const float *ys, const float *r, const int *off, int *cur, int N, int E, int K,
                            int C);
void pw_moe_combine_backward_input(float *dys, float *dr, const float *dy, const float *ys, const float *r,
                                   const int *off, int *cur, int N, int E, int K, int C, int acc_ys, int acc_r);

/* y (N,C) = x (N,C) * sigmoid(g[n]) a row (g (N), Qwen2-MoE's shared
 * expert gate). Backward: dx = dy sigmoid(g), dg[n] = (dy[n] . x[n])
 * sigmoid(g[n]) (1 - sigmoid(g[n])). */
void pw_sigmoid_gate_forward(float *y, const float *x, const float *g, int N, int C);
void pw_sigmoid_gate_backward_input(float *dx, float *dg, const float *dy, const float *x, const float *g, int N,
                                    int C, int acc_x, int acc_g);

#endif

/* lora: low-rank adapter kernels for a linear layer (LoRA, Hu et al. 2021,
 * as Hugging Face PEFT computes it):
 *
 *   y = x W^T + b + scale * (x A^T) B^T,   scale = alpha / r
 *
 * with A [r, C] (PEFT's lora_A.weight), B [OC, r] (lora_B.weight), x [N, C]
 * and y [N, OC]. The base linear runs through ops.h; these kernels add the
 * adapter's part and its gradients, one function per direction:
 *   forward:          h = x A^T (N, r, saved for the backward), y += scale h B^T
 *   backward_input:   dx += (scale dy B) A
 *   backward_weight:  dB += scale dy^T h,   dA += (scale dy B)^T x
 * dh = scale dy B (N, r) is recomputed by each backward half from dy (N x
 * OC x r multiply-adds, small next to the base's N x OC x C), so I and W
 * need no buffer between them. `dh` is scratch of N * r floats. */
#ifndef PW_LORA_H
#define PW_LORA_H

/* out (N, OC) += scale * (inp A^T) B^T; h (N, r) receives inp A^T. */
void pw_lora_forward(float *out, float *h, const float *inp, const float *A, const float *B, int N, int C, int OC,
                     int r, float scale);
/* dinp (N, C) += (scale dout B) A; dh: scratch (N, r). */
void pw_lora_backward_input(float *dinp, float *dh, const float *dout, const float *A, const float *B, int N, int C,
                            int OC, int r, float scale);
/* dA (r, C) += (scale dout B)^T inp, dB (OC, r) += scale dout^T h; dh:
 * scratch (N, r). Either gradient may be NULL (not wanted). */
void pw_lora_backward_weight(float *dA, float *dB, float *dh, const float *dout, const float *inp, const float *h,
                             const float *B, int N, int C, int OC, int r, float scale);
/* W (OC, C) += scale * B A: the adapter merged into its base weight. */
void pw_lora_merge_weight(float *W, const float *A, const float *B, int C, int OC, int r, float scale);

#endif

/* lora: the arithmetic of lora.h, three sgemms per direction at most. */
#include "lora.h"

#include "gemm.h"

void pw_lora_forward(float *out, float *h, const float *inp, const float *A, const float *B, int N, int C, int OC,
                     int r, float scale) {
  if (N <= 0 || OC <= 0 || r <= 0) return;
  /* h (N,r) = inp (N,C) @ A^T, A (r,C) */
  pw_sgemm(0, 1, N, r, C, 1.0f, inp, C, A, C, 0.0f, h, r);
  /* out (N,OC) += scale * h (N,r) @ B^T, B (OC,r) */
  pw_sgemm(0, 1, N, OC, r, scale, h, r, B, r, 1.0f, out, OC);
}

/* dh (N,r) = scale * dout (N,OC) @ B (OC,r) */
static void lora_dh(float *dh, const float *dout, const float *B, int N, int OC, int r, float scale) {
  pw_sgemm(0, 0, N, r, OC, scale, dout, OC, B, r, 0.0f, dh, r);
}

void pw_lora_backward_input(float *dinp, float *dh, const float *dout, const float *A, const float *B, int N, int C,
                            int OC, int r, float scale) {
  if (N <= 0 || C <= 0 || r <= 0) return;
  lora_dh(dh, dout, B, N, OC, r, scale);
  /* dinp (N,C) += dh (N,r) @ A (r,C) */
  pw_sgemm(0, 0, N, C, r, 1.0f, dh, r, A, C, 1.0f, dinp, C);
}

void pw_lora_merge_weight(float *W, const float *A, const float *B, int C, int OC, int r, float scale) {
  if (C <= 0 || OC <= 0 || r <= 0) return;
  /* W (OC,C) += scale * B (OC,r) @ A (r,C) */
  pw_sgemm(0, 0, OC, C, r, scale, B, r, A, C, 1.0f, W, C);
}

void pw_lora_backward_weight(float *dA, float *dB, float *dh, const float *dout, const float *inp, const float *h,
                             const float *B, int N, int C, int OC, int r, float scale) {
  if (N <= 0 || r <= 0) return;
  /* dB (OC,r) += scale * dout^T (OC,N) @ h (N,r) */
  if (dB && OC > 0) pw_sgemm(1, 0, OC, r, N, scale, dout, OC, h, r, 1.0f, dB, r);
  if (!dA || C <= 0) return;
  lora_dh(dh, dout, B, N, OC, r, scale);
  /* dA (r,C) += dh^T (r,N) @ inp (N,C) */
  pw_sgemm(1, 0, r, C, N, 1.0f, dh, r, inp, C, 1.0f, dA, C);
}

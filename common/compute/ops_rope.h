/* ops_rope: rotary embeddings' frequencies, one definition for the CPU
 * kernel (ops_attn.c) and the CUDA one (common/cuda/cu_attn_body.h), so
 * that both rotate by the same angles.
 *
 * inv_freq_i = 1 / theta^(2i/HD) as Hugging Face Llama computes it in
 * float32 (the exponent a float, the power correctly rounded: glibc's
 * powf, here pow in double rounded to float, which the GPU has too); with
 * Llama-3's rope_scaling (factor > 0) then moved exactly as transformers'
 * _compute_llama3_parameters does, in double, rounded to float once:
 * wavelength w = 2 pi / inv_freq; w > orig / low_freq_factor: inv_freq /
 * factor; w < orig / high_freq_factor: unchanged; between: (1 - s)
 * inv_freq / factor + s inv_freq, s = (orig / w - low_freq_factor) /
 * (high_freq_factor - low_freq_factor). Pure: no state, no allocation. */
#ifndef PW_OPS_ROPE_H
#define PW_OPS_ROPE_H

#include <math.h>

#include "hd.h"

/* A rope's parameters: theta (Hugging Face's rope_theta, our rope_base)
 * and Llama-3's rope_scaling (factor 0: none). */
typedef struct {
  float theta;
  float factor, low_freq_factor, high_freq_factor;
  int original_max_pos; /* original_max_position_embeddings */
} pw_rope;

static inline PW_HD float pw_rope_inv_freq(const pw_rope *r, int i, int HD) {
  float inv = 1.0f / (float)pow((double)r->theta, (double)((float)(2 * i) / (float)HD));
  if (!(r->factor > 0.0f)) return inv;
  double f = inv, w = 2.0 * 3.14159265358979323846 / f, orig = (double)r->original_max_pos;
  double lo = r->low_freq_factor, hi = r->high_freq_factor;
  if (w > orig / lo) return (float)(f / r->factor);
  if (w < orig / hi) return inv;
  double s = (orig / w - lo) / (hi - lo);
  return (float)((1.0 - s) * f / r->factor + s * f);
}

#endif

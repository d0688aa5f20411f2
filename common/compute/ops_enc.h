/* ops_enc: the kernels an encoder (BERT) adds to ops.h — the erf GELU,
 * tanh, token-type embeddings, the first row of a sequence ([CLS]), a
 * token embedding whose padding rows take no gradient, and the masked-LM
 * cross-entropy. ops.h's contracts hold: forwards overwrite `out`,
 * backward_weight accumulates (+=), backward_input overwrites or adds as
 * its `acc` flag says, nothing allocates. Shapes as in ops.h (B sequences
 * of T rows, N = B*T, C channels, V vocabulary). */
#ifndef PW_OPS_ENC_H
#define PW_OPS_ENC_H

#include <stdint.h>

/* GELU in its exact form, x * 0.5 * (1 + erf(x / sqrt(2))) (PyTorch's
 * gelu(approximate='none'), Hugging Face's "gelu"), over n floats. The
 * forward saves the derivative 0.5 * (1 + erf(x/sqrt(2))) + x * exp(-x^2/2)
 * / sqrt(2 pi) in dgelu (n): the backward is one product an element. */
void pw_gelu_erf_forward(float *out, float *dgelu, const float *inp, int n);
void pw_gelu_erf_backward_input(float *dinp, const float *dout, const float *dgelu, int n, int acc);

/* tanh over n floats (BERT's pooler). The backward reads the forward's
 * output: dinp = dout * (1 - out^2), PyTorch's tanh_backward. */
void pw_tanh_forward(float *out, const float *inp, int n);
void pw_tanh_backward_input(float *dinp, const float *dout, const float *out, int n, int acc);

/* Token-type embedding added to its input: out[b,t,:] = inp[b,t,:] +
 * wtt[type(b,t),:], inp/out (B,T,C), tok (B,T), wtt (types, C). The types
 * are a function of sequence b's tokens: without a separator (sep < 0)
 * all 0; else 0 up to and including the first `sep`, 1 after it (a
 * sentence pair as tokenizers make it: [CLS] a [SEP] b [SEP]); a position
 * holding `pad` (pad >= 0) is type 0 wherever it is, as tokenizers pad.
 * The input's gradient passes through; the weight's sums the rows of each
 * type. */
void pw_toktype_forward(float *out, const float *inp, const int32_t *tok, const float *wtt, int B, int T, int C,
                        int sep, int pad);
void pw_toktype_backward_input(float *dinp, const float *dout, int B, int T, int C, int acc);
void pw_toktype_backward_weight(float *dwtt, const float *dout, const int32_t *tok, int B, int T, int C, int sep,
                                int pad);

/* Row 0 of each sequence: inp (B,T,C) -> out (B,C) (BERT's [CLS] feeds
 * its pooler). The backward writes row 0's gradient and zeros (0 + 0)
 * for the others, or leaves them as they are when accumulating. */
void pw_first_row_forward(float *out, const float *inp, int B, int T, int C);
void pw_first_row_backward_input(float *dinp, const float *dout, int B, int T, int C, int acc);

/* pw_embed_backward_weight but for the rows whose token is `pad`, which
 * take no gradient (PyTorch's nn.Embedding padding_idx). */
void pw_embed_pad_backward_weight(float *dwte, const float *dout, const int32_t *tok, int N, int C, int pad);

/* Masked-LM softmax cross-entropy: pw_crossentropy_* over the rows whose
 * target is >= 0 only (a negative target, -100 by PyTorch's convention,
 * takes no part: no probabilities, a zero gradient). Returns scale * the
 * sum over those rows of -log softmax (in double); the caller passes scale
 * = 1 / (B_batch K), K the masked rows a sequence, so microbatch losses
 * sum to the mean over the batch's K B predictions. probs (N,V). */
float pw_xent_mlm_forward(float *probs, const float *logits, const int32_t *targets, int N, int V, float scale);
void pw_xent_mlm_backward_input(float *dlogits, const float *probs, const int32_t *targets, int N, int V,
                                float scale, int acc);

#endif

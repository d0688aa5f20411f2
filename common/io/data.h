/* data: training and eval batches as a pure function of (seed, step, index).
 *
 * Any process can draw any microbatch on its own: the first pipeline stage
 * draws its inputs, the last its targets, and nothing passes between them.
 * Sequence i of step k (0 <= i < batch_size) depends only on the dataset,
 * the seed, k and i — never on the microbatch count or on which process
 * asks — so microbatch j of size b is sequences j*b .. (j+1)*b-1.
 *
 * Kinds:
 *  text        bytes of a file (vocab 256). The last eval_fraction of the
 *              file is the eval split; the rest, of length N, is the train
 *              split. Samplers: `sequential` (docs/contracts.md: sequence i of step
 *              k starts at ((k*batch_size + i)*T) mod (N - T - 1); inputs
 *              bytes o..o+T-1, targets o+1..o+T) and `random` (start drawn
 *              from a hash of (seed, k, i)). Eval batches always use the
 *              sequential rule over the eval split.
 *  tokens      the ids of a token file (tokfile.h), with text's samplers
 *              and splits counted in ids.
 *  copy        synthetic tokens: a random first half (symbols 1..vocab-1),
 *              then the same symbols again; next-token targets.
 *  reverse     as copy, with the second half reversed.
 *  regression  features x ~ N(0,1) of width in_dim; target tanh(A x) of
 *              width out_dim, A a fixed teacher matrix drawn from the seed.
 *  classify    the same x; target class argmax(A x) (int32).
 *  shift       two inputs: random tokens s[t] and, per position, a float
 *              feature vector carrying a hidden key c[t] < keys; the target
 *              is s[t] shifted by c[t]. Neither input alone tells the
 *              target: the task of a two-tower (regions) model.
 *  labeled     token sequences with one label each, from a JSON Lines
 *              file (data_labeled.c): inputs (n,T) padded with the
 *              model's pad_token, targets one int32 class per sequence.
 * Synthetic kinds draw eval data from a disjoint stream.
 *
 * Masked LM (shape->mlm_predictions = K > 0, kinds text and tokens): the
 * window's tokens are corrupted at K positions (pw_mlm_corrupt); targets
 * are the original tokens there and PW_DATA_IGNORE elsewhere. */
#ifndef PW_DATA_H
#define PW_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "errors.h"
#include "spec.h"


typedef enum { PW_SPLIT_TRAIN, PW_SPLIT_EVAL } pw_split;

typedef struct pw_dataset pw_dataset;

/* Opens the dataset and checks it fits the shape (kind vs tokens/features,
 * vocabulary, the file long enough for one window of T+1 bytes in each
 * split). Errors name "data.path", "data.kind", ... */
PW_MUST_CHECK int pw_dataset_open(const pw_data_spec *spec, const pw_data_shape *shape, unsigned long long seed,
                    pw_dataset **out, pw_err *err);
void pw_dataset_close(pw_dataset *ds);

/* Fill sequences first .. first+n-1 of batch `step` (batch of batch_size).
 * inputs: int32 (n,T) tokens or float (n,in_dim) features.
 * targets: int32 (n,T) tokens, float (n,out_dim) for regression, or int32
 * (n) classes for classify. Either pointer may be NULL (the first stage
 * wants inputs only, the last targets only). */
void pw_dataset_batch(const pw_dataset *ds, pw_split split, long step, int first, int n,
                      int batch_size, void *inputs, void *targets);

/* A regions model's second input (shape->feature_dim > 0): float features
 * (n, T, feature_dim) of sequences first .. first+n-1 of batch `step`, the
 * same sequences pw_dataset_batch gives. Only kind shift has them. */
void pw_dataset_features(const pw_dataset *ds, pw_split split, long step, int first, int n, int batch_size,
                         float *features);

/* A target that takes no part in the loss (PyTorch's ignore_index). */
#define PW_DATA_IGNORE (-100)

/* Masked-LM corruption of one sequence x[0..T) in place, a pure function
 * of key: K distinct positions among those whose token is not pad (pad < 0:
 * every position; there must be at least K), each then replaced by mask
 * (8 in 10), by a random token below V (1 in 10) or kept (1 in 10). tg
 * (may be NULL) gets the original token at the chosen positions and
 * PW_DATA_IGNORE elsewhere. The draws: data.c's top comment. */
void pw_mlm_corrupt(uint64_t key, int T, int K, int V, int mask, int pad, int32_t *x, int32_t *tg);

/* Bytes in the train split (text) or 0. */
size_t pw_dataset_train_len(const pw_dataset *ds);

#endif

/* data_int: what data.c shares with the files beside it (private to
 * common/io): the masked-LM window check (data_mlm.c) and the parser of
 * labeled sequences (data_labeled.c). */
#ifndef PW_DATA_INT_H
#define PW_DATA_INT_H

#include <stddef.h>
#include <stdint.h>

#include "errors.h"
#include "spec.h"

/* Masked LM over ids[0..S): every window of T ids that starts below S - T
 * (the windows a sequence may read, data.c) keeps at least K non-pad
 * positions. ids are `width` bytes each (1: text; 2 or 4: tokfile.h).
 * Errors name data.path (the file, the split, the offset, its pad ids). */
PW_MUST_CHECK int pw__mlm_check_windows(const unsigned char *ids, unsigned width, size_t S, int T, int K, int pad,
                                        const char *path, const char *split, pw_err *err);

/* Labeled sequences from a JSON Lines file (docs/datasets.md): *ids gets
 * n rows of T int32 (cut to T, or filled with shape->pad_token), *labels
 * n int32; *cut how many lines were longer than T. Errors name data.path
 * with the file and the line. */
PW_MUST_CHECK int pw__labeled_parse(const unsigned char *buf, size_t len, const char *path, const pw_data_shape *shape,
                                    int32_t **ids, int32_t **labels, size_t *n, size_t *cut, pw_err *err);

#endif

/* fuzz_safetensors: the safetensors reader on any file contents.
 *
 * The bytes are written to a file (the reader's API takes a path, as the
 * worker and the coordinator use it); an accepted file must give tensors
 * whose byte ranges can be copied out without reading past the file. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char path[64];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!path[0]) snprintf(path, sizeof path, "/tmp/pw-fuzz-st.%d", (int)getpid());
  FILE *f = fopen(path, "wb");
  if (!f) abort();
  if (size && fwrite(data, 1, size, f) != size) abort();
  if (fclose(f)) abort();
  pw_st_file *st;
  pw_err err = {0};
  if (pw_st_open(path, &st, &err)) return 0;
  for (int i = 0; i < pw_st_count(st); i++) {
    const pw_st_tensor *t = pw_st_get(st, i);
    size_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= (size_t)t->shape[d];
    size_t esz = t->dtype == PW_ST_I64 || t->dtype == PW_ST_F64 ? 8 : 4;
    if (n > (64u << 20) / esz) continue; /* the reader checked it against the file; skip huge copies */
    void *dst = malloc(n * esz + 1);
    if (!dst) abort();
    if (pw_st_copy(st, t->name, t->dtype, t->ndim, t->shape, dst, &err)) abort();
    if (pw_st_find(st, t->name) != t) abort();
    free(dst);
  }
  (void)pw_st_meta_get(st, "format");
  pw_st_close(st);
  return 0;
}

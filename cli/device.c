/* device: --device cpu | cuda | cuda:N, for the commands that compute. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "pw_cuda.h"

int pw_cli_device(const char *spec, const pw_backend **be) {
  *be = NULL;
  if (!spec || strcmp(spec, "cpu") == 0) return 0;
  int dev = 0;
  if (strcmp(spec, "cuda") != 0) {
    char *end = NULL;
    long n = strncmp(spec, "cuda:", 5) == 0 ? strtol(spec + 5, &end, 10) : -1;
    if (n < 0 || n > 1024 || !end || end == spec + 5 || *end) {
      fprintf(stderr, "error: --device %s: expected cpu, cuda or cuda:N\n", spec);
      return 2;
    }
    dev = (int)n;
  }
  pw_err err = {0};
  if (pw_cuda_open(dev, be, &err)) {
    fprintf(stderr, "error: --device %s: %s\n", spec, err.msg);
    return 1;
  }
  return 0;
}

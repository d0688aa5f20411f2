/* collective: shard and chunk arithmetic and the ordered sum of
 * collective.h. */
#include "collective.h"

void pw_shard_range(size_t n, int k, int j, size_t *lo, size_t *hi) {
  size_t q = n / (size_t)k, rem = n % (size_t)k, uj = (size_t)j;
  *lo = uj * q + (uj < rem ? uj : rem);
  *hi = *lo + q + (uj < rem);
}

size_t pw_shard_max(size_t n, int k) { return (n + (size_t)k - 1) / (size_t)k; }

int pw_chunk_count(size_t len, size_t chunk) { return (int)((len + chunk - 1) / chunk); }

void pw_reduce_ordered(float *out, const float *const *in, int k, size_t n) {
  for (size_t i = 0; i < n; i++) {
    float acc = 0;
    for (int d = 0; d < k; d++) acc += in[d][i];
    out[i] = acc;
  }
}

uint64_t pw_coll_bytes_rs(size_t n, int k, int me) {
  size_t lo, hi;
  pw_shard_range(n, k, me, &lo, &hi);
  return k > 1 ? (uint64_t)(n - (hi - lo)) * 4 : 0;
}

uint64_t pw_coll_bytes_rs_ag(size_t n, int k, int me) {
  size_t lo, hi;
  pw_shard_range(n, k, me, &lo, &hi);
  return pw_coll_bytes_rs(n, k, me) + (uint64_t)(hi - lo) * (uint64_t)(k - 1) * 4;
}

size_t pw_dp_floats(size_t grad_numel, size_t train_numel, int dp, int zero, size_t chunk) {
  if (dp < 2) return 0;
  if (!zero) return (size_t)dp * pw_shard_max(grad_numel, dp);
  return (size_t)dp * pw_shard_max(train_numel, dp) + (size_t)(dp - 1) * chunk;
}

size_t pw_dp_state_floats(size_t train_numel, int dp, int zero) {
  return 2 * (zero && dp > 1 ? pw_shard_max(train_numel, dp) : train_numel);
}

uint64_t pw_dp_step_bytes(size_t grad_numel, size_t train_numel, int dp, int zero, int replica) {
  return dp < 2 ? 0 : pw_coll_bytes_rs_ag(zero ? train_numel : grad_numel, dp, replica);
}

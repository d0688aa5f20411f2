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

static void add_range(size_t (*out)[2], int *n, size_t a, size_t b) {
  if (a < b) out[*n][0] = a, out[*n][1] = b, (*n)++;
}

int pw_dp_full_ranges(const pw_model *m, const pw_prog_layout *L, const int *tied, int n_tied, size_t (*out)[2]) {
  int n = 0;
  for (int i = 0; i < L->n_shadow; i++) {
    add_range(out, &n, L->shadow[i][0], L->shadow[i][0] + L->shadow[i][2]);
    add_range(out, &n, L->shadow[i][1], L->shadow[i][1] + L->shadow[i][2]);
  }
  for (int k = 0; k < n_tied; k++) {
    int li = L->param_local[tied[k]];
    if (li < 0 || L->param_goff[li] == PW_LAYOUT_NONE) continue;
    add_range(out, &n, L->param_goff[li], L->param_goff[li] + m->params[tied[k]].numel);
  }
  /* sort (few entries) and merge */
  for (int i = 1; i < n; i++)
    for (int j = i; j > 0 && out[j][0] < out[j - 1][0]; j--) {
      size_t a = out[j][0], b = out[j][1];
      out[j][0] = out[j - 1][0], out[j][1] = out[j - 1][1], out[j - 1][0] = a, out[j - 1][1] = b;
    }
  int k = 0;
  for (int i = 0; i < n; i++) {
    if (k && out[i][0] <= out[k - 1][1]) {
      if (out[i][1] > out[k - 1][1]) out[k - 1][1] = out[i][1];
      continue;
    }
    out[k][0] = out[i][0], out[k][1] = out[i][1], k++;
  }
  return k;
}

size_t pw_ranges_floats(const size_t (*r)[2], int n) {
  size_t t = 0;
  for (int i = 0; i < n; i++) t += r[i][1] - r[i][0];
  return t;
}

size_t pw_dp_floats(size_t grad_numel, size_t train_numel, size_t full, int dp, int zero, size_t chunk) {
  if (dp < 2) return 0;
  if (!zero) return (size_t)dp * pw_shard_max(grad_numel, dp);
  /* the main shards, a chunk from each replica, and the full ranges: packed, then dp shards of them */
  return (size_t)dp * pw_shard_max(train_numel, dp) + (size_t)(dp - 1) * chunk +
         (full ? full + (size_t)dp * pw_shard_max(full, dp) : 0);
}

size_t pw_dp_state_floats(size_t train_numel, int dp, int zero) {
  return 2 * (zero && dp > 1 ? pw_shard_max(train_numel, dp) : train_numel);
}

uint64_t pw_dp_step_bytes(size_t grad_numel, size_t train_numel, size_t full, int dp, int zero, int replica) {
  if (dp < 2) return 0;
  return zero ? pw_coll_bytes_rs_ag(train_numel, dp, replica) + pw_coll_bytes_rs_ag(full, dp, replica)
              : pw_coll_bytes_rs_ag(grad_numel, dp, replica);
}

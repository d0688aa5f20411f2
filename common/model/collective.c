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

/* Sorts n ranges (few) and merges those that overlap or touch; returns how many are left. */
static int sort_merge(size_t (*out)[2], int n) {
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
  return sort_merge(out, n);
}

size_t pw_ranges_floats(const size_t (*r)[2], int n) {
  size_t t = 0;
  for (int i = 0; i < n; i++) t += r[i][1] - r[i][0];
  return t;
}

size_t pw_dp_floats(size_t grad_numel, size_t train_numel, size_t full, int dp, int zero, size_t chunk) {
  if (dp < 2) return 0;
  if (!zero) return (size_t)dp * pw_shard_max(grad_numel, dp);
  /* the main shards (zero 2: only the one sent; zero 3 sends none: pgather.c), a chunk from each replica
   * (zero 3: none), and the full ranges: packed, then dp shards of them */
  size_t main = zero == 3 ? 0 : (size_t)(zero == 2 ? 1 : dp) * pw_shard_max(train_numel, dp) + (size_t)(dp - 1) * chunk;
  return main + (full ? full + (size_t)dp * pw_shard_max(full, dp) : 0);
}

size_t pw_dp_state_floats(size_t train_numel, int dp, int zero) {
  return 2 * (zero && dp > 1 ? pw_shard_max(train_numel, dp) : train_numel);
}

uint64_t pw_dp_step_bytes(size_t grad_numel, size_t train_numel, size_t full, int dp, int zero, int replica) {
  if (dp < 2) return 0;
  if (zero == 3) return pw_coll_bytes_rs_ag(full, dp, replica); /* the parameters: gathered per layer */
  if (zero == 2)
    return pw_coll_bytes_rs_ag(train_numel, dp, replica) - pw_coll_bytes_rs(train_numel, dp, replica) +
           pw_coll_bytes_rs_ag(full, dp, replica);
  return zero ? pw_coll_bytes_rs_ag(train_numel, dp, replica) + pw_coll_bytes_rs_ag(full, dp, replica)
              : pw_coll_bytes_rs_ag(grad_numel, dp, replica);
}

/* ---- ZeRO-2 ------------------------------------------------------------------- */

static int inside(const size_t (*r)[2], int n, size_t a, size_t b) {
  for (int i = 0; i < n; i++)
    if (r[i][0] <= a && b <= r[i][1]) return 1;
  return 0;
}

int pw_dp_wgrad_parts(const pw_model *m, const pw_prog_layout *L, int node, const size_t (*full)[2], int n_full) {
  const pw_node *nd = &m->nodes[L->node_lo + node];
  int ids[2] = {nd->w, nd->b}, bits = 0;
  for (int k = 0; k < 2; k++) {
    size_t off = k ? L->node_db[node] : L->node_dw[node];
    if (ids[k] < 0 || off == PW_LAYOUT_NONE) continue;
    if (!inside(full, n_full, off, off + m->params[ids[k]].numel)) bits |= 1 << k;
  }
  return bits;
}

/* Floats of node's redirected parts. */
static size_t node_floats(const pw_model *m, const pw_prog_layout *L, int node, int bits) {
  const pw_node *nd = &m->nodes[L->node_lo + node];
  return (bits & 1 ? m->params[nd->w].numel : 0) + (bits & 2 ? m->params[nd->b].numel : 0);
}

size_t pw_dp_wgrad_floats(const pw_model *m, const pw_prog_layout *L, const size_t (*full)[2], int n_full) {
  size_t most = 0;
  for (int i = 0; i < L->node_hi - L->node_lo; i++) {
    size_t n = node_floats(m, L, i, pw_dp_wgrad_parts(m, L, i, full, n_full));
    if (n > most) most = n;
  }
  return most;
}

size_t pw_dp_wgrad_bufs_floats(size_t scratch, size_t train_numel, int dp) {
  size_t smax = pw_shard_max(train_numel, dp), piece = scratch < smax ? scratch : smax;
  return dp < 2 ? 0 : scratch + 2 * (size_t)(dp - 1) * piece;
}

uint64_t pw_dp_wgrad_bytes(const pw_model *m, const pw_prog_layout *L, const size_t (*full)[2], int n_full, int dp,
                           int me) {
  size_t lo, hi;
  uint64_t sent = 0;
  if (dp < 2) return 0;
  pw_shard_range(L->sz.train_numel, dp, me, &lo, &hi);
  for (int i = 0; i < L->node_hi - L->node_lo; i++) {
    int bits = pw_dp_wgrad_parts(m, L, i, full, n_full);
    const pw_node *nd = &m->nodes[L->node_lo + i];
    for (int k = 0; k < 2; k++) {
      if (!(bits >> k & 1)) continue;
      size_t a = k ? L->node_db[i] : L->node_dw[i], b = a + m->params[k ? nd->b : nd->w].numel;
      size_t ia = a > lo ? a : lo, ib = b < hi ? b : hi;
      sent += (uint64_t)(b - a - (ia < ib ? ib - ia : 0)) * 4;
    }
  }
  return sent;
}

int pw_dp_live_ranges(size_t train_numel, int dp, int me, const size_t (*full)[2], int n_full, size_t (*out)[2]) {
  int n = 0;
  for (int i = 0; i < n_full; i++) add_range(out, &n, full[i][0], full[i][1]);
  size_t lo, hi;
  pw_shard_range(train_numel, dp, me, &lo, &hi);
  add_range(out, &n, lo, hi);
  return sort_merge(out, n);
}

void pw_reduce_ordered_add(float *acc, const float *const *in, int k, size_t n) {
  for (size_t i = 0; i < n; i++) {
    float s = 0;
    for (int d = 0; d < k; d++) s += in[d][i];
    acc[i] += s;
  }
}

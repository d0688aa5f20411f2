/* test_collective: the shard and chunk arithmetic of common/model/collective.h
 * and the order of its sum, on in-memory buffers:
 *   - shards tile [0, n) contiguously in member order, differ by at most
 *     one element, the longer ones first (what docs/contracts.md tells a
 *     PyTorch reproduction), for n below, at and above k;
 *   - chunks tile a shard, the last one shorter;
 *   - pw_reduce_ordered adds in member order bit for bit
 *     (((0 + x0) + x1) + x2 ...), in place too, and on inputs chosen so a
 *     ring's rotated order ((x1 + x2) + x0) gives other bits: the order is
 *     what the test pins, not just the value;
 *   - a reduce-scatter then all-gather simulated member by member over
 *     buffers gives every member the ordered sum of the whole buffer, and
 *     the bytes each sends are pw_coll_bytes_rs_ag, 2 (k-1) n over the
 *     group. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "collective.h"

static void test_shards_tile(void **state) {
  (void)state;
  static const size_t ns[] = {0, 1, 2, 5, 7, 64, 1000, 1001, 65537};
  for (size_t t = 0; t < sizeof ns / sizeof *ns; t++)
    for (int k = 1; k <= 9; k++) {
      size_t n = ns[t], prev = 0, shortest = (size_t)-1, longest = 0, lo, hi;
      for (int j = 0; j < k; j++) {
        pw_shard_range(n, k, j, &lo, &hi);
        if (lo != prev) fail_msg("n %zu k %d: shard %d starts at %zu, previous ended at %zu", n, k, j, lo, prev);
        assert_true(hi >= lo);
        size_t len = hi - lo;
        if (len < shortest) shortest = len;
        if (len > longest) longest = len;
        assert_int_equal(len, n / (size_t)k + ((size_t)j < n % (size_t)k)); /* the documented rule */
        prev = hi;
      }
      assert_int_equal(prev, n);
      assert_true(longest - shortest <= 1);
      assert_int_equal(pw_shard_max(n, k), longest);
    }
}

static void test_chunks_tile(void **state) {
  (void)state;
  assert_int_equal(pw_chunk_count(0, 4), 0);
  assert_int_equal(pw_chunk_count(1, 4), 1);
  assert_int_equal(pw_chunk_count(4, 4), 1);
  assert_int_equal(pw_chunk_count(5, 4), 2);
  assert_int_equal(pw_chunk_count(65536, PW_COLL_CHUNK), 1);
  assert_int_equal(pw_chunk_count(65537, PW_COLL_CHUNK), 2);
}

static void test_order(void **state) {
  (void)state;
  /* 1 + 1e8 - 1e8 in floats: 0 in order 0,1,2 ... */
  float x0[3] = {1.0f, 0.1f, -0.0f}, x1[3] = {1e8f, 0.2f, -0.0f}, x2[3] = {-1e8f, 0.3f, -0.0f}, out[3];
  const float *in[3] = {x0, x1, x2};
  pw_reduce_ordered(out, in, 3, 3);
  for (int i = 0; i < 3; i++) {
    float want = 0;
    want += x0[i], want += x1[i], want += x2[i];
    if (memcmp(&out[i], &want, sizeof want)) fail_msg("element %d: %.9g, in order %.9g", i, out[i], want);
  }
  assert_true(out[0] == 0.0f);
  /* ... while a ring's rotated order, (x1 + x2) + x0, gives 1 */
  float ring = 0;
  ring += x1[0], ring += x2[0], ring += x0[0];
  assert_true(ring == 1.0f);
  /* 0 + (-0) is +0: the accumulator starts at +0 as the trainer's does */
  assert_false(signbit(out[2]));
  /* in place on the first input */
  float y0[2] = {3.0f, 1e-8f}, y1[2] = {-3.0f, 1.0f};
  const float *iny[2] = {y0, y1};
  pw_reduce_ordered(y0, iny, 2, 2);
  assert_true(y0[0] == 0.0f && y0[1] == 1e-8f + 1.0f);
}

/* k members, n floats each: a direct reduce-scatter (member j gets shard j
 * from everyone, sums in member order), then an all-gather of the sums. */
static void test_rs_ag_simulated(void **state) {
  (void)state;
  for (int k = 2; k <= 4; k++) {
    size_t n = 1003;
    float **x = calloc((size_t)k, sizeof *x), **res = calloc((size_t)k, sizeof *res);
    uint64_t sent_total = 0;
    for (int d = 0; d < k; d++) {
      x[d] = malloc(n * sizeof(float));
      res[d] = malloc(n * sizeof(float));
      for (size_t i = 0; i < n; i++) x[d][i] = (float)((i * 7 + (size_t)d * 13) % 23) * 0.37f - 3.3f + (float)d * 1e-4f;
    }
    for (int j = 0; j < k; j++) { /* owner j sums its shard, then sends it to all */
      size_t lo, hi;
      pw_shard_range(n, k, j, &lo, &hi);
      const float *in[4];
      for (int d = 0; d < k; d++) in[d] = x[d] + lo;
      float *sum = malloc((hi - lo + 1) * sizeof(float));
      pw_reduce_ordered(sum, in, k, hi - lo);
      for (int d = 0; d < k; d++) memcpy(res[d] + lo, sum, (hi - lo) * sizeof(float));
      free(sum);
    }
    for (int d = 0; d < k; d++) {
      for (size_t i = 0; i < n; i++) {
        float want = 0;
        for (int e = 0; e < k; e++) want += x[e][i];
        if (memcmp(&res[d][i], &want, sizeof want)) fail_msg("k %d member %d element %zu differs", k, d, i);
      }
      sent_total += pw_coll_bytes_rs_ag(n, k, d);
      size_t lo, hi;
      pw_shard_range(n, k, d, &lo, &hi);
      assert_int_equal(pw_coll_bytes_rs(n, k, d), (n - (hi - lo)) * 4);
    }
    assert_true(sent_total == (uint64_t)2 * (uint64_t)(k - 1) * n * 4);
    for (int d = 0; d < k; d++) free(x[d]), free(res[d]);
    free(x), free(res);
  }
  assert_true(pw_coll_bytes_rs_ag(1000, 1, 0) == 0);
  /* the planner's per-step count: the gradient arena (zero 0) or the main part */
  assert_true(pw_dp_step_bytes(1000, 900, 0, 2, 0, 1) == 1000 * 4);
  assert_true(pw_dp_step_bytes(1000, 900, 0, 2, 1, 1) == 900 * 4);
  assert_true(pw_dp_step_bytes(1000, 900, 40, 2, 1, 1) == (900 + 40) * 4);
  assert_true(pw_dp_step_bytes(1000, 900, 0, 1, 1, 0) == 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_shards_tile),
      cmocka_unit_test(test_chunks_tile),
      cmocka_unit_test(test_order),
      cmocka_unit_test(test_rs_ag_simulated),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

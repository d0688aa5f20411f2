/* test_zero2: ZeRO-2's arithmetic (common/model/collective.h) and the
 * program's weight-gradient scratch (pw_prog_set_wgrad):
 *   - the live ranges are the shard and the full ranges, sorted and merged
 *     (overlapping, touching, apart), for every replica;
 *   - pw_reduce_ordered_add adds the copies in replica order, then the
 *     sum into the accumulator: inputs chosen so any other association
 *     gives other bits;
 *   - which node parts go through the scratch (none inside a full range),
 *     the scratch's size (the largest node's), the receive buffers, and the
 *     bytes per microbatch: over the replicas exactly (dp - 1) x the
 *     redirected floats;
 *   - a GPT with tied embeddings (a shadow: a full range) trained one
 *     microbatch through a lent arena and the scratch, its spans added by
 *     the sink into the arena, has the plain program's gradients bit for
 *     bit (0 + g is g); two microbatches agree to float rounding (the
 *     scratch sums each microbatch apart); the sink saw every redirected
 *     part once per microbatch and never a full range. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "collective.h"
#include "model.h"
#include "prog.h"
#include "rng.h"

static void test_live_ranges(void **st) {
  (void)st;
  size_t out[4][2];
  const size_t full[3][2] = {{0, 10}, {60, 80}, {100, 120}};
  /* 100 over 3: [0, 34), [34, 67), [67, 100) */
  int n = pw_dp_live_ranges(100, 3, 0, full, 3, out);
  assert_int_equal(n, 3); /* the shard swallows [0, 10) */
  assert_true(out[0][0] == 0 && out[0][1] == 34 && out[1][0] == 60 && out[1][1] == 80 && out[2][0] == 100);
  n = pw_dp_live_ranges(100, 3, 1, full, 3, out);
  assert_int_equal(n, 3); /* [34, 67) and [60, 80) overlap */
  assert_true(out[0][1] == 10 && out[1][0] == 34 && out[1][1] == 80 && out[2][0] == 100 && out[2][1] == 120);
  n = pw_dp_live_ranges(100, 3, 2, full, 3, out);
  assert_int_equal(n, 2); /* [60, 80), [67, 100) and [100, 120) overlap or touch: one */
  assert_true(out[0][1] == 10 && out[1][0] == 60 && out[1][1] == 120);
  n = pw_dp_live_ranges(100, 4, 3, NULL, 0, out);
  assert_true(n == 1 && out[0][0] == 75 && out[0][1] == 100);
  assert_int_equal(pw_dp_live_ranges(2, 3, 2, NULL, 0, out), 0); /* an empty shard */
}

static void test_reduce_ordered_add(void **st) {
  (void)st;
  /* ((0 + 1e8) + 1) + -1e8 = 0 in float, so acc stays 1; acc + 1e8 + 1 - 1e8 or (1 + -1e8) + 1e8 give 0 or 2 */
  float a[] = {1e8f, 3.0f}, b[] = {1.0f, 0.5f}, c[] = {-1e8f, 0.25f}, acc[] = {1.0f, 1.0f};
  const float *in[3] = {a, b, c};
  pw_reduce_ordered_add(acc, in, 3, 2);
  assert_true(acc[0] == 1.0f);
  assert_true(acc[1] == 4.75f);
}

static pw_model gpt(int tied) {
  pw_model_spec s;
  memset(&s, 0, sizeof s);
  s.tmpl = PW_TEMPLATE_GPT;
  s.vocab_size = 19, s.seq_len = 5, s.d_model = 8, s.n_layers = 2, s.n_heads = 2, s.ffn_hidden = 12;
  s.init_std = 0.3f, s.tie_embeddings = tied;
  pw_model m;
  pw_err err = {0};
  assert_int_equal(pw_model_build(&s, &m, &err), 0);
  return m;
}

static void test_sizes(void **st) {
  (void)st;
  pw_model m = gpt(1);
  pw_prog_layout L;
  assert_int_equal(pw_prog_layout_build(&m, 0, m.n_layers, 2, &L), 0);
  size_t full[8][2];
  int nf = pw_dp_full_ranges(&m, &L, NULL, 0, full);
  assert_true(nf >= 2); /* the embedding's main gradient and its shadow */
  const size_t(*f)[2] = (const size_t(*)[2])full;
  size_t most = 0, redirected = 0;
  for (int i = 0; i < L.node_hi - L.node_lo; i++) {
    const pw_node *n = &m.nodes[L.node_lo + i];
    int bits = pw_dp_wgrad_parts(&m, &L, i, f, nf), want = 0;
    size_t here = 0;
    for (int k = 0; k < 2; k++) {
      int id = k ? n->b : n->w;
      size_t off = k ? L.node_db[i] : L.node_dw[i];
      if (id < 0 || off == PW_LAYOUT_NONE) continue;
      int in_full = 0;
      for (int r = 0; r < nf; r++) in_full |= full[r][0] <= off && off + m.params[id].numel <= full[r][1];
      if (!in_full) want |= 1 << k, here += m.params[id].numel;
    }
    if (bits != want) fail_msg("node %d: parts %d, expected %d", i, bits, want);
    if (here > most) most = here;
    redirected += here;
  }
  assert_true(redirected > 0 && redirected < L.sz.train_numel); /* the embedding is kept whole */
  assert_int_equal(pw_dp_wgrad_floats(&m, &L, f, nf), most);
  for (int dp = 2; dp <= 5; dp++) {
    uint64_t sent = 0;
    for (int j = 0; j < dp; j++) sent += pw_dp_wgrad_bytes(&m, &L, f, nf, dp, j);
    if (sent != (uint64_t)(dp - 1) * redirected * 4)
      fail_msg("dp %d: %llu bytes over the replicas, expected (dp-1) x %zu floats", dp, (unsigned long long)sent,
               redirected);
  }
  assert_int_equal(pw_dp_wgrad_bytes(&m, &L, f, nf, 1, 0), 0);
  /* scratch + 2 parities x (dp-1) pieces of min(scratch, longest shard) */
  assert_int_equal(pw_dp_wgrad_bufs_floats(10, 100, 3), 10 + 2 * 2 * 10);
  assert_int_equal(pw_dp_wgrad_bufs_floats(100, 100, 3), 100 + 2 * 2 * 34);
  assert_int_equal(pw_dp_wgrad_bufs_floats(100, 100, 1), 0);
  /* zero 2 keeps one shard (the one sent), no received ones; sends no reduce-scatter at the step end */
  assert_int_equal(pw_dp_floats(1000, 900, 0, 3, 2, 16), 300 + 2 * 16);
  assert_true(pw_dp_step_bytes(1000, 900, 0, 3, 2, 0) == 300 * 2 * 4);
  pw_prog_layout_free(&L);
  pw_model_free(&m);
}

/* ---- the program's scratch ----------------------------------------------------- */

typedef struct {
  float *arena;
  const size_t (*full)[2];
  int n_full, calls;
} sink;

static int add_spans(void *ctx, const float *scratch, const size_t (*spans)[2], int n, pw_err *err) {
  sink *s = ctx;
  (void)err; /* never fails */
  for (int k = 0; k < n; k++) {
    for (int r = 0; r < s->n_full; r++)
      if (spans[k][0] < s->full[r][1] && s->full[r][0] < spans[k][0] + spans[k][1]) fail_msg("a full range redirected");
    for (size_t i = 0; i < spans[k][1]; i++) s->arena[spans[k][0] + i] += scratch[i];
    scratch += spans[k][1];
  }
  s->calls++;
  return 0;
}

static void microbatch(pw_prog *p, const pw_model *m, uint64_t key) {
  pw_rng r;
  pw_rng_seed(&r, key);
  for (int i = 0; i < pw_prog_n_inputs(p); i++) {
    const pw_prog_port *pt = pw_prog_input(p, i);
    int32_t *d = pw_prog_value(p, 0, pt->value);
    for (size_t k = 0; k < pt->bytes / 4; k++) d[k] = (int32_t)pw_rng_below(&r, (uint64_t)m->data.vocab_size);
  }
  assert_int_equal(pw_prog_forward(p, 0, NULL, NULL), 0);
  assert_int_equal(key & 1 ? pw_prog_backward(p, 0, NULL) : pw_prog_backward_input(p, 0, NULL), 0);
  if (!(key & 1)) assert_int_equal(pw_prog_backward_weight(p, 0, NULL), 0);
}

static void test_scratch_equals_arena(void **st) {
  (void)st;
  pw_model m = gpt(1);
  pw_err err = {0};
  pw_prog_config c = {.layer_lo = 0, .layer_hi = m.n_layers, .mb_size = 2, .batch_size = 4, .n_slots = 1};
  pw_prog *plain, *lent;
  assert_int_equal(pw_prog_create(&m, &c, &plain, &err), 0);
  c.no_grads = 1;
  assert_int_equal(pw_prog_create(&m, &c, &lent, &err), 0);
  pw_prog_init_params(plain, 5), pw_prog_init_params(lent, 5);
  const pw_prog_layout *L = pw_prog_layout_of(lent);
  size_t full[8][2], whole[1][2] = {{0, pw_prog_grad_numel(lent)}};
  int nf = pw_dp_full_ranges(&m, L, NULL, 0, full);
  const size_t(*f)[2] = (const size_t(*)[2])full;
  size_t gn = pw_prog_grad_numel(lent);
  float *arena = malloc(gn * sizeof(float)), *scratch = malloc(pw_dp_wgrad_floats(&m, L, f, nf) * sizeof(float));
  sink s = {arena, f, nf, 0};
  assert_int_equal(pw_prog_set_wgrad(lent, arena, (const size_t(*)[2])whole, 1, f, nf, scratch, add_spans, &s), 0);
  for (size_t i = 0; i < gn; i++) arena[i] = 1.0f;
  pw_prog_zero_grad(lent); /* the live ranges: here the whole arena */
  pw_prog_zero_grad(plain);
  int flushes = 0;
  for (int i = 0; i < L->node_hi - L->node_lo; i++) flushes += pw_dp_wgrad_parts(&m, L, i, f, nf) != 0;
  for (int mb = 0; mb < 2; mb++) {
    microbatch(plain, &m, 40 + (uint64_t)mb), microbatch(lent, &m, 40 + (uint64_t)mb);
    assert_int_equal(s.calls, (mb + 1) * flushes);
    const float *a = pw_prog_grads(plain);
    assert_ptr_equal(pw_prog_grads(lent), arena);
    for (size_t i = 0; i < gn; i++) {
      double d = a[i] - arena[i], tol = mb ? 1e-6 * (1 + (a[i] < 0 ? -a[i] : a[i])) : 0;
      if (d > tol || -d > tol)
        fail_msg("microbatch %d: gradient element %zu: %.9g through the arena, %.9g through the scratch", mb, i,
                 (double)a[i], (double)arena[i]);
    }
  }
  pw_prog_free(plain), pw_prog_free(lent);
  free(arena), free(scratch);
  pw_model_free(&m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_live_ranges),
      cmocka_unit_test(test_reduce_ordered_add),
      cmocka_unit_test(test_sizes),
      cmocka_unit_test(test_scratch_equals_arena),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

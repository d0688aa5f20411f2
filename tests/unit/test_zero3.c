/* test_zero3: ZeRO-3's bookkeeping (common/model/zero3.h) and the
 * program's lent parameters and per-layer gathers (pw_prog_set_pgather):
 *   - a GPT with tied embeddings in one stage: one unit per layer, each
 *     parameter its nodes read in it once, the tied embedding in both the
 *     embedding's and the head's units (the head's runs then not adjacent
 *     in the arena), the largest unit's size; cut into two stages at every
 *     layer, each stage's copy of the embedding in its first or last unit
 *     and every parameter in exactly one unit;
 *   - for dp 1 to 7 (shards of uneven sizes; a parameter spanning two or
 *     more shards is asserted to occur) the replicas' pieces of every unit
 *     cover its buffer exactly once, each piece in its replica's shard,
 *     and the buffer assembled from them holds every parameter where the
 *     runs say; the bytes a pass sends sum over the replicas to (dp - 1) x
 *     every unit's floats;
 *   - the planner's sizes;
 *   - a program with a lent arena holding only a shard: init draws exactly
 *     the whole program's values there and touches nothing else; a fake
 *     gather (from a whole copy) is asked for each layer in order with the
 *     next one (forward ascending, backward descending, a remat recompute's
 *     last layer once and followed by the layer below it, W nothing, -1
 *     at each end) and gives the plain
 *     program's loss and gradients bit for bit; a failing gather stops
 *     the entry point and is returned by it and the next one. */
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
#include "zero3.h"

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

/* Unit u holds local parameter lp. */
static int has_param(const pw_z3_units *z, int u, int lp) {
  for (int j = z->par_lo[u]; j < z->par_lo[u + 1]; j++)
    if (z->par[j] == lp) return 1;
  return 0;
}

static void test_units(void **st) {
  (void)st;
  pw_model m = gpt(1);
  pw_prog_layout L;
  assert_int_equal(pw_prog_layout_build(&m, 0, m.n_layers, 2, &L), 0);
  pw_z3_units z;
  assert_int_equal(pw_z3_units_build(&m, &L, &z), 0);
  assert_int_equal(z.n_units, m.n_layers);
  assert_int_equal(z.layer_lo, 0);
  int tok = m.nodes[m.layers[0].node_lo].w; /* the embedding's weight: read again by the head */
  assert_true(tok >= 0);
  assert_true(has_param(&z, 0, L.param_local[tok]) && has_param(&z, z.n_units - 1, L.param_local[tok]));
  size_t most = 0;
  for (int u = 0; u < z.n_units; u++) {
    size_t want = 0;
    for (int i = m.layers[u].node_lo; i < m.layers[u].node_hi; i++) { /* every parameter read, once */
      int ids[2] = {m.nodes[i].w, m.nodes[i].b};
      for (int k = 0; k < 2; k++)
        if (ids[k] >= 0 && !has_param(&z, u, L.param_local[ids[k]])) fail_msg("unit %d lacks parameter %d", u, ids[k]);
    }
    for (int j = z.par_lo[u]; j < z.par_lo[u + 1]; j++) want += m.params[L.param_model[z.par[j]]].numel;
    assert_int_equal(z.floats[u], want);
    size_t at = 0;
    for (int r = z.run_lo[u]; r < z.run_lo[u + 1]; r++) { /* sorted, apart, back to back in the buffer */
      assert_int_equal(z.runs[r].at, at);
      if (r > z.run_lo[u]) assert_true(z.runs[r].lo > z.runs[r - 1].hi);
      at += z.runs[r].hi - z.runs[r].lo;
    }
    assert_int_equal(at, want);
    if (want > most) most = want;
  }
  assert_int_equal(z.max_floats, most);
  assert_true(z.run_lo[z.n_units] - z.run_lo[z.n_units - 1] >= 2); /* the head: its norm and the far embedding */
  assert_int_equal(pw_z3_max_runs(&z), z.run_lo[z.n_units] - z.run_lo[z.n_units - 1]);
  pw_z3_units_free(&z);
  pw_prog_layout_free(&L);
  /* tied across stages: each stage's layout has its own copy, in its first or last unit, at the unit's offset */
  for (int cut = 1; cut < m.n_layers; cut++) {
    pw_prog_layout La, Lb;
    pw_z3_units za, zb;
    assert_int_equal(pw_prog_layout_build(&m, 0, cut, 2, &La), 0);
    assert_int_equal(pw_prog_layout_build(&m, cut, m.n_layers, 2, &Lb), 0);
    assert_int_equal(pw_z3_units_build(&m, &La, &za), 0);
    assert_int_equal(pw_z3_units_build(&m, &Lb, &zb), 0);
    assert_int_equal(za.n_units + zb.n_units, m.n_layers);
    assert_int_equal(zb.layer_lo, cut);
    assert_true(has_param(&za, 0, La.param_local[tok]) && has_param(&zb, zb.n_units - 1, Lb.param_local[tok]));
    size_t fa = 0, fb = 0;
    for (int u = 0; u < za.n_units; u++) fa += za.floats[u];
    for (int u = 0; u < zb.n_units; u++) fb += zb.floats[u];
    assert_int_equal(fa, La.sz.numel); /* no tied use inside either stage: every parameter once */
    assert_int_equal(fb, Lb.sz.numel);
    pw_z3_units_free(&za), pw_z3_units_free(&zb);
    pw_prog_layout_free(&La), pw_prog_layout_free(&Lb);
  }
  pw_model_free(&m);
}

static void test_pieces(void **st) {
  (void)st;
  pw_model m = gpt(1);
  pw_prog_layout L;
  assert_int_equal(pw_prog_layout_build(&m, 0, m.n_layers, 2, &L), 0);
  pw_z3_units z;
  assert_int_equal(pw_z3_units_build(&m, &L, &z), 0);
  size_t n = L.sz.numel, all = 0;
  for (int u = 0; u < z.n_units; u++) all += z.floats[u];
  float *arena = malloc(n * sizeof(float)), *buf = malloc(z.max_floats * sizeof(float));
  unsigned char *seen = malloc(z.max_floats);
  pw_z3_piece *pc = malloc(sizeof *pc * (size_t)pw_z3_max_runs(&z));
  for (size_t i = 0; i < n; i++) arena[i] = (float)i;
  int spanning = 0;
  for (int dp = 1; dp <= 7; dp++) {
    uint64_t sent = 0;
    for (int d = 0; d < dp; d++) sent += pw_z3_pass_bytes(&z, n, dp, d);
    if (sent != (uint64_t)(dp - 1) * all * 4) fail_msg("dp %d: %llu bytes a pass", dp, (unsigned long long)sent);
    for (int u = 0; u < z.n_units; u++) {
      memset(seen, 0, z.max_floats);
      for (size_t i = 0; i < z.max_floats; i++) buf[i] = -1.0f;
      for (int d = 0; d < dp; d++) {
        size_t lo, hi;
        pw_shard_range(n, dp, d, &lo, &hi);
        int np = pw_z3_pieces(&z, u, lo, hi, pc);
        size_t part = 0;
        for (int k = 0; k < np; k++) {
          assert_true(pc[k][1] >= lo && pc[k][1] + pc[k][2] <= hi && pc[k][2] > 0);
          for (size_t i = 0; i < pc[k][2]; i++) {
            if (seen[pc[k][0] + i]++) fail_msg("dp %d unit %d: buffer element %zu twice", dp, u, pc[k][0] + i);
            buf[pc[k][0] + i] = arena[pc[k][1] + i];
          }
          part += pc[k][2];
        }
        assert_int_equal(pw_z3_unit_part(&z, u, lo, hi), part);
      }
      for (size_t i = 0; i < z.floats[u]; i++)
        if (!seen[i]) fail_msg("dp %d unit %d: buffer element %zu from no replica", dp, u, i);
      for (int j = z.par_lo[u]; j < z.par_lo[u + 1]; j++) { /* each parameter whole where its run puts it */
        size_t off = L.param_off[z.par[j]], numel = m.params[L.param_model[z.par[j]]].numel;
        int r = z.run_lo[u];
        while (!(off >= z.runs[r].lo && off < z.runs[r].hi)) r++;
        const float *p = buf + z.runs[r].at + (off - z.runs[r].lo);
        for (size_t i = 0; i < numel; i++)
          if (p[i] != (float)(off + i)) fail_msg("dp %d unit %d: parameter %d element %zu", dp, u, z.par[j], i);
        size_t lo0, hi0, lo1, hi1; /* a parameter across a shard boundary */
        for (int d = 0; d + 1 < dp; d++) {
          pw_shard_range(n, dp, d, &lo0, &hi0), pw_shard_range(n, dp, d + 1, &lo1, &hi1);
          spanning += off < hi0 && off + numel > lo1;
        }
      }
    }
  }
  assert_true(spanning > 0);
  assert_true(n % 3 != 0 || n % 7 != 0); /* uneven shards among the dp swept */
  /* the planner: the longest shard, two pages, the ring of the largest unit */
  assert_int_equal(pw_z3_param_floats(1001, 4, 50), 251 + 2 * 1024 + 3 * 50);
  assert_int_equal(pw_z3_pass_gathers(&z), z.n_units);
  free(arena), free(buf), free(seen), free(pc);
  pw_z3_units_free(&z);
  pw_prog_layout_free(&L);
  pw_model_free(&m);
}

/* ---- the program's lent parameters ------------------------------------------- */

typedef struct {
  pw_prog *p;
  const pw_z3_units *z;
  float *whole;       /* every parameter, as the plain program has them */
  float *lent;        /* the arena */
  int log[64][2], n;  /* (layer, next) asked for */
  int fail_at;        /* call index that fails, or -1 */
} fake;

static int fake_gather(void *ctx, int layer, int next, pw_err *err) {
  fake *f = ctx;
  const pw_prog_layout *L = pw_prog_layout_of(f->p);
  if (f->n < 64) f->log[f->n][0] = layer, f->log[f->n][1] = next;
  if (f->n++ == f->fail_at) return pw_err_set(err, PW_EIO, "fake", "gather %d failed", f->n - 1);
  for (int i = 0; i < L->n_params; i++) /* all back into the arena, then the layer's into the whole copy */
    pw_prog_param_at(f->p, i)->data = f->lent + L->param_off[i];
  if (layer < 0) return 0;
  int u = layer - f->z->layer_lo;
  for (int j = f->z->par_lo[u]; j < f->z->par_lo[u + 1]; j++)
    pw_prog_param_at(f->p, f->z->par[j])->data = f->whole + L->param_off[f->z->par[j]];
  return 0;
}

static void fill(pw_prog *p, const pw_model *m, uint64_t key) {
  pw_rng r;
  pw_rng_seed(&r, key);
  for (int i = 0; i < pw_prog_n_inputs(p); i++) {
    const pw_prog_port *pt = pw_prog_input(p, i);
    int32_t *d = pw_prog_value(p, 0, pt->value);
    for (size_t k = 0; k < pt->bytes / 4; k++) d[k] = (int32_t)pw_rng_below(&r, (uint64_t)m->data.vocab_size);
  }
}

static void expect_log(const fake *f, const int (*want)[2], int n) {
  if (f->n != n) fail_msg("%d gathers asked for, expected %d", f->n, n);
  for (int k = 0; k < n; k++)
    if (f->log[k][0] != want[k][0] || f->log[k][1] != want[k][1])
      fail_msg("call %d: (%d, %d), expected (%d, %d)", k, f->log[k][0], f->log[k][1], want[k][0], want[k][1]);
}

static void run_lent(int remat) {
  pw_model m = gpt(1);
  pw_err err = {0};
  pw_prog_config c = {.layer_lo = 0, .layer_hi = m.n_layers, .mb_size = 2, .batch_size = 4, .n_slots = 1,
                      .remat = remat, .n_work = remat};
  pw_prog *plain, *sh;
  assert_int_equal(pw_prog_create(&m, &c, &plain, &err), 0);
  c.no_params = 1;
  assert_int_equal(pw_prog_create(&m, &c, &sh, &err), 0);
  const pw_prog_layout *L = pw_prog_layout_of(sh);
  size_t n = L->sz.numel, lo = n / 3, hi = 2 * n / 3 + 1;
  float *lent = malloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++) lent[i] = -7.0f;
  pw_z3_units z;
  assert_int_equal(pw_z3_units_build(&m, L, &z), 0);
  fake f = {.p = sh, .z = &z, .whole = pw_prog_params(plain), .lent = lent, .fail_at = -1};
  assert_int_equal(pw_prog_set_pgather(sh, lent, lo, hi, fake_gather, &f), 0);
  assert_ptr_equal(pw_prog_params(sh), lent);
  pw_prog_init_params(plain, 9), pw_prog_init_params(sh, 9);
  for (size_t i = 0; i < n; i++) { /* the shard drawn as the whole program's, nothing else touched */
    float want = i >= lo && i < hi ? pw_prog_params(plain)[i] : -7.0f;
    if (lent[i] != want) fail_msg("element %zu: %g, expected %g", i, (double)lent[i], (double)want);
  }
  pw_prog_zero_grad(plain), pw_prog_zero_grad(sh);
  float la, lb;
  fill(plain, &m, 3), fill(sh, &m, 3);
  assert_int_equal(pw_prog_forward(plain, 0, &la, NULL), 0);
  assert_int_equal(pw_prog_forward(sh, 0, &lb, NULL), 0);
  assert_true(la == lb);
  int nl = m.n_layers, k = 0, want[64][2];
  for (int l = 0; l < nl; l++) want[k][0] = l, want[k][1] = l + 1 < nl ? l + 1 : -1, k++;
  want[k][0] = want[k][1] = -1, k++;
  expect_log(&f, (const int(*)[2])want, k);
  f.n = 0, k = 0;
  assert_int_equal(pw_prog_backward_input(plain, 0, NULL), 0);
  assert_int_equal(pw_prog_backward_input(sh, 0, NULL), 0);
  if (remat) /* the recompute, then the backward from the layer it ended on, asked for once */
    for (int l = 0; l < nl; l++) want[k][0] = l, want[k][1] = l + 1 < nl ? l + 1 : nl - 2, k++;
  for (int l = nl - (remat ? 2 : 1); l >= 0; l--) want[k][0] = l, want[k][1] = l - 1, k++;
  want[k][0] = want[k][1] = -1, k++;
  expect_log(&f, (const int(*)[2])want, k);
  f.n = 0;
  assert_int_equal(pw_prog_backward_weight(plain, 0, NULL), 0);
  assert_int_equal(pw_prog_backward_weight(sh, 0, NULL), 0);
  assert_int_equal(f.n, 0); /* W reads no parameter */
  for (size_t i = 0; i < pw_prog_grad_numel(sh); i++)
    if (pw_prog_grads(plain)[i] != pw_prog_grads(sh)[i]) fail_msg("gradient element %zu differs", i);
  /* a failing gather: the entry point stops, and it and the next one say why */
  f.n = 0, f.fail_at = 1;
  fill(sh, &m, 4);
  memset(&err, 0, sizeof err);
  assert_int_equal(pw_prog_forward(sh, 0, NULL, &err), PW_EIO);
  assert_non_null(strstr(err.msg, "gather 1 failed"));
  assert_int_equal(f.n, 3); /* layer 0, layer 1 (failed), the end */
  assert_int_equal(pw_prog_backward(sh, 0, NULL), PW_EIO);
  pw_z3_units_free(&z);
  pw_prog_free(plain), pw_prog_free(sh);
  free(lent);
  pw_model_free(&m);
}

static void test_lent(void **st) {
  (void)st;
  run_lent(0);
}

static void test_lent_remat(void **st) {
  (void)st;
  run_lent(1);
}

static void test_refusals(void **st) {
  (void)st;
  pw_model m = gpt(0);
  pw_err err = {0};
  pw_prog_config c = {.layer_lo = 0, .layer_hi = m.n_layers, .mb_size = 2, .batch_size = 4, .n_slots = 1};
  pw_prog *p;
  assert_int_equal(pw_prog_create(&m, &c, &p, &err), 0);
  float x;
  assert_int_equal(pw_prog_set_pgather(p, &x, 0, 0, fake_gather, NULL), PW_ENOTSUP); /* owns its arena */
  pw_prog_free(p);
  pw_model_free(&m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_units),
      cmocka_unit_test(test_pieces),
      cmocka_unit_test(test_lent),
      cmocka_unit_test(test_lent_remat),
      cmocka_unit_test(test_refusals),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

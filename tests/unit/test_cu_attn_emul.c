/* test_cu_attn_emul: the CUDA rope and plain attention kernels' bodies
 * (common/cuda/cu_attn_body.h; the tiled attention's are
 * test_cu_fa_emul's) run on the CPU, every thread index of every
 * launch in a loop, the launches as cu_attn.cu's entry points make them,
 * against the CPU rows of the op table (kernels.c: ops.h's kernels). The
 * only check their indexing gets on a machine without a GPU
 * (tests/gpu/test_cuda_attn.c runs the real kernels where one is).
 *
 * - rope, attention: forward (outputs pre-filled with NaN:
 *   every element written), backward overwriting (NaN pre-filled) and
 *   accumulating into random gradients, each within 1e-5 of the largest
 *   |element| of the CPU's result.
 * - Shapes B 2, T 1, 4, 7 and 33, heads (NH, NKV) (1, 1), (3, 3), (4, 2)
 *   grouped-query with Llama-3's rope scaling, (4, 1) multi-query, HD 4, 12
 *   and 16, with the bodies' sums over HD in chunks of 8 (the GPU's 64): one
 *   partial chunk, a full and a partial one, two full ones. */
#define PW_CU_ATTN_CHUNK 8

#include "../../common/cuda/cu_attn_body.h"
#include "kernels.h"
#include "opcheck.h"

/* ---- cu_attn.cu's entry points, each launch a loop over its threads ------- */

static int nkv_of(const pw_node *nd) { return nd->NKV > 0 ? nd->NKV : nd->NH; }

static pw_cu_attn_dims dims_of(const pw_kernel_io *io) {
  return pw_cu_attn_dims_make(io->B, io->n->T, io->n->OC, io->n->NH, nkv_of(io->n));
}

static void emu_rope(const pw_kernel_io *io, int backward) {
  const pw_node *nd = io->n;
  int nkv = nkv_of(nd), HD = nd->C / (nd->NH + 2 * nkv);
  pw_rope rp = {nd->base, nd->rope_factor, nd->rope_low_freq, nd->rope_high_freq, nd->rope_orig_max_pos};
  size_t n = pw_cu_rope_n(io->B, nd->T, nd->NH, nkv, HD);
  for (size_t i = 0; i < n; i++)
    if (!backward)
      pw_cu_rope_body(io->out, io->in0, nd->T, nd->NH, nkv, HD, rp, 0, 0, i);
    else
      pw_cu_rope_body(io->din0, io->dout, nd->T, nd->NH, nkv, HD, rp, 1, io->acc0, i);
}

static void emu_attention_f(const pw_kernel_io *io) {
  pw_cu_attn_dims d = dims_of(io);
  for (size_t i = 0; i < pw_cu_attn_n(d); i++) pw_cu_attn_fwd_body(io->out, io->aux, io->in0, d, i);
}

/* dq's threads, then dk/dv's: the two launches of cu_attn.cu */
static void emu_attention_i(const pw_kernel_io *io) {
  pw_cu_attn_dims d = dims_of(io);
  for (size_t i = 0; i < pw_cu_attn_n(d); i++)
    pw_cu_attn_bwd_q_body(io->din0, io->dout, io->out, io->in0, io->aux, d, io->acc0, i);
  for (size_t i = 0; i < pw_cu_attn_kv_n(d); i++)
    pw_cu_attn_bwd_kv_body(io->din0, io->dout, io->out, io->in0, io->aux, d, io->acc0, i);
}

/* ---- comparison ------------------------------------------------------------ */

/* |got - want| <= 1e-5 max|want| for every element (NaN fails); says which. */
static void expect_close(const char *what, const float *got, const float *want, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; i++) m = fabs(want[i]) > m ? fabs(want[i]) : m;
  for (size_t i = 0; i < n; i++)
    if (!(fabs((double)got[i] - want[i]) <= 1e-5 * m))
      fail_msg("%s: element %zu of %zu is %.9g, expected %.9g (1e-5 of max %.3g)", what, i, n, got[i], want[i], m);
}

static void fill_nan(float *x, size_t n) {
  for (size_t i = 0; i < n; i++) x[i] = NAN;
}

/* ---- one op, one shape ------------------------------------------------------ */

typedef struct {
  int op;
  const char *name;
  void (*fwd)(const pw_kernel_io *io);
  void (*bwd)(const pw_kernel_io *io);
} emu_op;

static void emu_rope_f(const pw_kernel_io *io) { emu_rope(io, 0); }
static void emu_rope_i(const pw_kernel_io *io) { emu_rope(io, 1); }

static const emu_op OPS[] = {
    {PW_OP_ROPE, "rope", emu_rope_f, emu_rope_i},
    {PW_OP_ATTENTION, "attention", emu_attention_f, emu_attention_i},
};

/* Forward, then the backward overwriting and accumulating, CPU row against
 * the emulated one; both backwards read the CPU forward's out and aux. */
static void compare_op(const emu_op *e, int B, int T, int NH, int NKV, int HD, float factor) {
  int C = NH * HD, W = C + 2 * NKV * HD;
  pw_node nd = {.op = (uint8_t)e->op, .C = W, .OC = e->op == PW_OP_ROPE ? W : C, .NH = NH, .NKV = NKV, .T = T,
                .base = 10000.0f};
  if (factor > 0) /* Llama-3's: factor 8, 1 and 4 over 8192 positions, shrunk to these T */
    nd.rope_factor = factor, nd.rope_low_freq = 1.0f, nd.rope_high_freq = 4.0f, nd.rope_orig_max_pos = 16;
  int rope = e->op == PW_OP_ROPE;
  size_t nq = (size_t)B * T * W, no = rope ? nq : (size_t)B * T * C;
  size_t naux = e->op == PW_OP_ATTENTION ? (size_t)B * NH * T * T : 0;
  size_t nscr = e->op == PW_OP_ATTENTION ? (size_t)T * T : 0;
  float *qkv = oc_alloc(nq, sizeof(float)), *dout = oc_alloc(no, sizeof(float));
  float *out_c = oc_alloc(no, sizeof(float)), *out_g = oc_alloc(no, sizeof(float));
  float *aux_c = oc_alloc(naux, sizeof(float)), *aux_g = oc_alloc(naux, sizeof(float));
  float *scr_c = oc_alloc(nscr, sizeof(float)), *scr_g = nscr ? malloc(nscr * sizeof(float)) : NULL;
  float *din_c = oc_alloc(nq, sizeof(float)), *din_g = oc_alloc(nq, sizeof(float));
  char what[160];
  oc_seed((uint64_t)(e->op * 1000000 + B * 100000 + T * 1000 + NH * 100 + NKV * 10 + HD));
  oc_fill(qkv, nq, 2.0); /* peaky softmax rows */
  oc_fill(dout, no, 1.0);

  pw_kernel_io c = {.n = &nd, .in0 = qkv, .out = out_c, .aux = aux_c, .scratch = scr_c, .rows = B * T, .B = B};
  pw_kernel_io g = c;
  g.out = out_g, g.aux = aux_g, g.scratch = scr_g;
  fill_nan(out_g, no);
  fill_nan(aux_g, naux);
  pw_kernel_of(e->op)->forward(&c);
  e->fwd(&g);
  snprintf(what, sizeof what, "%s B=%d T=%d NH=%d NKV=%d HD=%d f=%g: out", e->name, B, T, NH, NKV, HD, factor);
  expect_close(what, out_g, out_c, no);
  if (naux) {
    snprintf(what, sizeof what, "%s B=%d T=%d NH=%d NKV=%d HD=%d: att", e->name, B, T, NH, NKV, HD);
    expect_close(what, aux_g, aux_c, naux);
  }

  for (int acc = 0; acc <= 1; acc++) {
    c.dout = g.dout = dout;
    c.din0 = din_c, g.din0 = din_g;
    g.out = out_c, g.aux = aux_c; /* the same forward for both */
    c.acc0 = g.acc0 = acc;
    if (acc) {
      oc_fill(din_c, nq, 0.5);
      memcpy(din_g, din_c, nq * sizeof(float));
    } else {
      fill_nan(din_c, nq);
      fill_nan(din_g, nq);
    }
    if (scr_g) fill_nan(scr_g, nscr);
    pw_kernel_of(e->op)->backward_input(&c);
    e->bwd(&g);
    snprintf(what, sizeof what, "%s B=%d T=%d NH=%d NKV=%d HD=%d f=%g acc=%d: dqkv", e->name, B, T, NH, NKV, HD, factor, acc);
    expect_close(what, din_g, din_c, nq);
  }
  free(qkv), free(dout), free(out_c), free(out_g), free(aux_c), free(aux_g), free(scr_c), free(scr_g);
  free(din_c), free(din_g);
}

/* Multi-head (NH = NKV), grouped-query (4 query heads on 2 kv heads) and
 * multi-query (on 1); Llama-3's rope scaling on some. */
static void check_all(int op_index) {
  static const int Ts[] = {1, 4, 7, 33}, HDs[] = {4, 12, 16};
  static const int heads[][2] = {{1, 1}, {3, 3}, {4, 2}, {4, 1}};
  for (size_t t = 0; t < sizeof Ts / sizeof *Ts; t++)
    for (size_t h = 0; h < sizeof heads / sizeof *heads; h++)
      for (size_t d = 0; d < sizeof HDs / sizeof *HDs; d++)
        compare_op(&OPS[op_index], 2, Ts[t], heads[h][0], heads[h][1], HDs[d], h == 2 && d != 1 ? 8.0f : 0.0f);
}

static void test_rope(void **state) {
  (void)state;
  check_all(0);
}
static void test_attention(void **state) {
  (void)state;
  check_all(1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rope),
      cmocka_unit_test(test_attention),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

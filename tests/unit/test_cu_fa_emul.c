/* test_cu_fa_emul: the GPU's tiled attention (FlashAttention-2,
 * common/cuda/cu_fa_body.h) run on the CPU — every launch as cu_fa.cu
 * makes them (the backward's D and the bf16 copies first), every block,
 * each phase a loop over the block's 256 threads (or 8 warps, the tensor
 * cores' products as plain loops), shared memory an array poisoned with
 * NaN before each block — against ops_flash.c's kernels (ops.h's and
 * bf16.h's pw_attention_tiled_*). The only check the kernels' indexing,
 * masking and rounding get without a GPU (tests/gpu/test_cuda_attn.c and
 * test_cuda_bf16.c run the real ones where one is).
 *
 * - float32: forward (out and lse pre-filled with NaN: every element
 *   written), backward overwriting (NaN) and accumulating into random
 *   gradients, both reading the CPU forward's out and lse: within 1e-5 of
 *   the largest |element| of the CPU's result (the sums run in another
 *   order; a wrong mask, index or scale is off by far more).
 * - bf16: the same, within 1e-4 of the largest but at a few elements (1 in
 *   1000, at least 3, each within 2^-8): a P or dS the two compute a float32
 *   rounding apart that lies on a bf16 rounding boundary is rounded one bf16
 *   step apart (the operands are the same bf16 values, the float32 sums in
 *   another order). The forward's key tile is the CPU's 128, so P = exp(s -
 *   m) is rounded against the same running max m; with other key tiles
 *   (forced below) m differs, and the forward is held to 2^-8 only.
 * - Every run twice, the threads of each phase in the other order the
 *   second time: the same bits (a phase reading what another thread of it
 *   writes — a race on the GPU — gives other bits).
 * - Shapes: one row, HD 12 (padded to 16), T 70 and 130 (partial tiles of
 *   64 and 128), HD 64 and 128, multi-head, grouped-query (4 on 2) and
 *   multi-query (4 on 1), two sequences; the tiles the GPU picks
 *   (pw_cu_fa_plan) and forced ones, 16 x 32 and 32 x 16, over T 40 (query
 *   and key tiles of different sizes across the diagonal).
 * - The masks against the CPU's _mask kernels: a sliding window (T 200,
 *   window 37: key tiles the window spans and skips), bidirectional with
 *   pads (a sequence all pad: rows that attend uniformly), causal with pads
 *   (the first sequence's leading pads: causal rows whose keys are all
 *   pad), a window with pads; default and forced tiles. */
static int emu_reverse;
#define PW_PH_EMU_ORDER(i, n) (emu_reverse ? (n) - 1 - (i) : (i))

#include "../../common/cuda/cu_fa_body.h"
#include "bf16.h"
#include "opcheck.h"
#include "ops.h"

static unsigned char *sm; /* a block's shared memory */

/* ---- cu_fa.cu's launches, each block in turn ------------------------------------------ */

static void block_start(const pw_cu_fa *d) { memset(sm, 0xff, d->bytes); /* NaN floats, NaN bf16s */ }

/* bf16 programs: cu_fa.cu's bf16 copies (the conversion body's bits) */
static uint16_t *bf16_copy(const float *x, size_t n) {
  uint16_t *b = malloc((n ? n : 1) * sizeof *b);
  assert_non_null(b);
  for (size_t i = 0; i < n; i++) pw_cu_bf16_from_el(b, x, i);
  return b;
}

static void emu_forward(const pw_cu_fa *d0, float *out, float *lse, const float *qkv) {
  pw_cu_fa dd = *d0, *d = &dd;
  uint16_t *qb = d->bf16 ? bf16_copy(qkv, (size_t)d->B * d->T * d->W) : NULL;
  d->qkvb = qb;
  int nq = pw_cu_fa_tiles(d->T, d->BQ);
  for (int b = 0; b < d->B; b++)
    for (int h = 0; h < d->NH; h++)
      for (int x = 0; x < nq; x++) {
        block_start(d);
        pw_cu_fa_fwd_block(d, out, lse, qkv, nq - 1 - x, h, b, sm);
      }
  free(qb);
}

/* D first (a thread a row), the bf16 copies, then the dq and dk/dv blocks */
static void emu_backward(const pw_cu_fa *dq0, const pw_cu_fa *dkv0, float *dqkv, const float *dout, const float *out,
                         const float *qkv, const float *lse, int acc) {
  pw_cu_fa q = *dq0, k = *dkv0, *dq = &q, *dkv = &k;
  float *D = malloc(pw_cu_fa_d_n(dq) * sizeof *D);
  assert_non_null(D);
  for (size_t i = 0; i < pw_cu_fa_d_n(dq); i++) pw_cu_fa_d_row(dq, D, dout, out, i);
  uint16_t *qb = dq->bf16 ? bf16_copy(qkv, (size_t)dq->B * dq->T * dq->W) : NULL;
  uint16_t *ob = dq->bf16 ? bf16_copy(dout, (size_t)dq->B * dq->T * dq->C) : NULL;
  q.D = k.D = D, q.qkvb = k.qkvb = qb, q.doutb = k.doutb = ob;
  int nq = pw_cu_fa_tiles(dq->T, dq->BQ), nk = pw_cu_fa_tiles(dkv->T, dkv->BK);
  for (int b = 0; b < dq->B; b++)
    for (int h = 0; h < dq->NH; h++)
      for (int x = 0; x < nq; x++) {
        block_start(dq);
        pw_cu_fa_dq_block(dq, dqkv, dout, qkv, lse, acc, nq - 1 - x, h, b, sm);
      }
  for (int b = 0; b < dkv->B; b++)
    for (int g = 0; g < dkv->NKV; g++)
      for (int x = 0; x < nk; x++) {
        block_start(dkv);
        pw_cu_fa_dkv_block(dkv, dqkv, dout, qkv, lse, acc, x, g, b, sm);
      }
  free(D), free(qb), free(ob);
}

/* ---- comparison ------------------------------------------------------------------------ */

/* Within tol of max |want| everywhere but (tipped) at up to 1 in 1000
 * elements (and 3) within 2^-8 of it. NaN fails. */
static void expect_close(const char *what, const float *got, const float *want, size_t n, double tol, int tipped_ok) {
  double m = 0, worst = 0;
  size_t tipped = 0, allowed = tipped_ok ? (n / 1000 > 3 ? n / 1000 : 3) : 0;
  for (size_t i = 0; i < n; i++) m = fabs(want[i]) > m ? fabs(want[i]) : m;
  for (size_t i = 0; i < n; i++) {
    double e = fabs((double)got[i] - want[i]);
    if (!(e <= tol * m) && (!(e <= m / 256) || ++tipped > allowed))
      fail_msg("%s: element %zu of %zu is %.9g, expected %.9g (%g of max %.3g; %zu beyond it)", what, i, n, got[i],
               want[i], tol, m, tipped);
    worst = e > worst ? e : worst;
  }
  print_message("  %-62s max err %.2e of %.3g, %zu tipped\n", what, worst, m, tipped);
}

static void expect_bits(const char *what, const float *a, const float *b, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (memcmp(&a[i], &b[i], sizeof a[i]))
      fail_msg("%s: element %zu differs with the threads in the other order (%.9g, %.9g): a race", what, i, a[i], b[i]);
}

static float *alloc_f(size_t n) {
  float *p = malloc((n ? n : 1) * sizeof *p);
  assert_non_null(p);
  return p;
}
static float *nan_f(size_t n) {
  float *p = alloc_f(n);
  for (size_t i = 0; i < n; i++) p[i] = NAN;
  return p;
}

/* ---- one shape --------------------------------------------------------------------------- */

/* The masks: none but the causal one, or as mk says (tokens made here:
 * pads where mk->pad says, see masked_tokens). */
typedef struct {
  int window, bidir, pads; /* pads: the tokens have pads (1), and a sequence all pad first (2) */
} emu_mask;

/* B sequences of T tokens, pad 0: a run of pads at the end of each (and
 * at the start of the first: 2), tokens 1.. elsewhere; the first's pads at
 * its start make causal rows whose keys are all pad (uniform rows), and
 * with pads 2 the second sequence is all pad (uniform bidirectional rows). */
static int32_t *masked_tokens(int B, int T, int pads) {
  int32_t *tok = malloc((size_t)B * T * sizeof *tok);
  assert_non_null(tok);
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) {
      int pad = t >= T - 1 - (T / 3 + b) % (T / 2 + 1) || (b == 0 && t < T / 5) || (pads == 2 && b == 1);
      tok[(size_t)b * T + t] = pad ? 0 : 1 + (b * 7 + t) % 50;
    }
  return tok;
}

/* bq, bk > 0: those tiles for all three kernels, else pw_cu_fa_plan's;
 * em NULL: causal. */
static void compare(int bf16, int B, int T, int NH, int NKV, int HD, int bq, int bk, const emu_mask *em) {
  int C = NH * HD;
  pw_cu_fa f = pw_cu_fa_make(B, T, C, NH, NKV, bf16);
  pw_attn_mask mk = {0};
  int32_t *tok = NULL;
  if (em) {
    mk.window = em->window, mk.bidir = em->bidir;
    if (em->pads) mk.tok = tok = masked_tokens(B, T, em->pads), mk.pad = 0;
    f.causal = !em->bidir, f.window = em->window, f.tok = tok, f.pad = 0;
  }
  pw_cu_fa dq = f, dkv = f;
  if (bq) {
    pw_cu_fa_layout(&f, PW_FA_FWD, bq, bk), pw_cu_fa_layout(&dq, PW_FA_DQ, bq, bk);
    pw_cu_fa_layout(&dkv, PW_FA_DKV, bq, bk);
  } else {
    assert_int_equal(pw_cu_fa_plan(&f, PW_FA_FWD), 0);
    assert_int_equal(pw_cu_fa_plan(&dq, PW_FA_DQ), 0);
    assert_int_equal(pw_cu_fa_plan(&dkv, PW_FA_DKV), 0);
  }
  assert_true(f.bytes <= PW_FA_SMEM_MAX && dq.bytes <= PW_FA_SMEM_MAX && dkv.bytes <= PW_FA_SMEM_MAX);
  size_t nqkv = (size_t)B * T * f.W, no = (size_t)B * T * C, nl = (size_t)B * NH * T;
  float *qkv = alloc_f(nqkv), *dout = alloc_f(no), *sc = alloc_f(pw_attention_tiled_scratch(T, C, NH, NKV));
  pw_bf16 *bs = malloc(pw_attention_tiled_bf16_scratch(B, T, C) * sizeof *bs);
  assert_non_null(bs);
  oc_seed((uint64_t)(bf16 * 7777777 + B * 100000 + T * 1000 + NH * 100 + NKV * 10 + HD + bq));
  oc_fill(qkv, nqkv, 2.0); /* peaky softmax rows */
  oc_fill(dout, no, 1.0);
  float *out = nan_f(no), *lse = nan_f(nl);
  if (bf16)
    pw_attention_tiled_forward_bf16_mask(out, lse, sc, bs, qkv, B, T, C, NH, NKV, &mk);
  else
    pw_attention_tiled_forward_mask(out, lse, sc, qkv, B, T, C, NH, NKV, &mk);
  char name[200], what[260];
  snprintf(name, sizeof name, "%s B %d T %d NH %d NKV %d HD %d tiles %dx%d/%dx%d%s%s%s", bf16 ? "bf16" : "f32", B, T,
           NH, NKV, HD, f.BQ, f.BK, dq.BQ, dq.BK, em && em->bidir ? " bidir" : "",
           em && em->window ? " window" : "", tok ? " pads" : "");
  double tol = bf16 ? 1e-4 : 1e-5, ftol = bf16 && f.BK != PW_ATTN_TILE_K ? 1.0 / 256 : tol;

  float *eo[2], *el[2];
  for (int r = 0; r < 2; r++) {
    emu_reverse = r;
    eo[r] = nan_f(no), el[r] = nan_f(nl);
    emu_forward(&f, eo[r], el[r], qkv);
  }
  snprintf(what, sizeof what, "%s: out", name);
  expect_close(what, eo[0], out, no, ftol, bf16);
  expect_bits(what, eo[0], eo[1], no);
  snprintf(what, sizeof what, "%s: lse", name);
  expect_close(what, el[0], lse, nl, ftol, bf16);
  expect_bits(what, el[0], el[1], nl);

  for (int acc = 0; acc <= 1; acc++) {
    float *want = acc ? alloc_f(nqkv) : nan_f(nqkv), *got[2];
    if (acc) oc_fill(want, nqkv, 0.5);
    for (int r = 0; r < 2; r++) {
      got[r] = alloc_f(nqkv);
      memcpy(got[r], want, nqkv * sizeof *want);
      emu_reverse = r;
      emu_backward(&dq, &dkv, got[r], dout, out, qkv, lse, acc);
    }
    if (bf16)
      pw_attention_tiled_backward_input_bf16_mask(want, sc, bs, dout, out, qkv, lse, B, T, C, NH, NKV, acc, &mk);
    else
      pw_attention_tiled_backward_input_mask(want, sc, dout, out, qkv, lse, B, T, C, NH, NKV, acc, &mk);
    snprintf(what, sizeof what, "%s: dqkv%s", name, acc ? " acc" : "");
    expect_close(what, got[0], want, nqkv, tol, bf16);
    expect_bits(what, got[0], got[1], nqkv);
    free(want), free(got[0]), free(got[1]);
  }
  free(qkv), free(dout), free(sc), free(bs), free(out), free(lse), free(tok);
  for (int r = 0; r < 2; r++) free(eo[r]), free(el[r]);
}

static void check_all(int bf16) {
  static const int shapes[][5] = {
      /* B, T, NH, NKV, HD */
      {2, 1, 2, 2, 16}, {2, 7, 3, 3, 12}, {2, 70, 4, 2, 64}, {1, 130, 4, 1, 64}, {1, 130, 2, 2, 128},
  };
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
    compare(bf16, shapes[i][0], shapes[i][1], shapes[i][2], shapes[i][3], shapes[i][4], 0, 0, NULL);
  compare(bf16, 2, 40, 4, 2, 16, 16, 32, NULL);
  compare(bf16, 2, 40, 4, 2, 16, 32, 16, NULL);
  /* the masks: a sliding window across key tiles, bidirectional with pads
   * (a sequence all pad: uniform rows), causal with pads (rows whose keys
   * are all pad), the window with pads */
  static const emu_mask window = {.window = 37}, bidir = {.bidir = 1, .pads = 2}, pads = {.pads = 1},
                        wpads = {.window = 20, .pads = 1};
  compare(bf16, 1, 200, 4, 2, 64, 0, 0, &window);
  compare(bf16, 2, 40, 4, 2, 16, 16, 32, &window);
  compare(bf16, 2, 130, 4, 2, 64, 0, 0, &bidir);
  compare(bf16, 2, 40, 2, 2, 16, 32, 16, &bidir);
  compare(bf16, 2, 130, 2, 2, 64, 0, 0, &pads);
  compare(bf16, 2, 70, 4, 1, 16, 16, 16, &wpads);
}

static void test_fa_f32(void **state) {
  (void)state;
  check_all(0);
}
static void test_fa_bf16(void **state) {
  (void)state;
  check_all(1);
}

/* The GPU's tiles at the shapes that matter (GPT-2 small's HD 64 and
 * Llama's 128): the forward with the CPU's key tile in both precisions,
 * everything within the shared memory a block may have. */
static void test_plans(void **state) {
  (void)state;
  for (int bf16 = 0; bf16 <= 1; bf16++)
    for (int HD = 64; HD <= 128; HD *= 2) {
      pw_cu_fa d = pw_cu_fa_make(8, 1024, 12 * HD, 12, 12, bf16);
      assert_int_equal(pw_cu_fa_plan(&d, PW_FA_FWD), 0);
      assert_int_equal(d.BK, PW_ATTN_TILE_K);
      print_message("  %s HD %3d: forward %dx%d %u bytes", bf16 ? "bf16" : "f32 ", HD, d.BQ, d.BK, d.bytes);
      assert_int_equal(pw_cu_fa_plan(&d, PW_FA_DQ), 0);
      print_message(", dq %dx%d %u", d.BQ, d.BK, d.bytes);
      assert_int_equal(pw_cu_fa_plan(&d, PW_FA_DKV), 0);
      print_message(", dk/dv %dx%d %u\n", d.BQ, d.BK, d.bytes);
    }
  pw_cu_fa d = pw_cu_fa_make(1, 16, 4096, 1, 1, 0); /* HD 4096: nothing fits */
  assert_int_equal(pw_cu_fa_plan(&d, PW_FA_FWD), -1);
}

static int setup(void **state) {
  (void)state;
  sm = malloc(PW_FA_SMEM_MAX);
  return sm ? 0 : -1;
}
static int teardown(void **state) {
  (void)state;
  free(sm);
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_plans),
      cmocka_unit_test(test_fa_f32),
      cmocka_unit_test(test_fa_bf16),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}

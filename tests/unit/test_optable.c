/* test_optable: the op table (common/model/optable.h, its facts, and
 * common/compute/kernels.h, its kernels) is complete, and the facts moved
 * into it give what the code they replaced gave.
 *
 * - Every op has a row: a name, a kernel forward, a tensor-parallel role
 *   and a decode declared, and the two halves agree (a decode that runs an
 *   op has a decode kernel; one that skips it is a loss; one that refuses
 *   it has none). A new pw_op that forgets any of these fails here.
 * - The tensor-parallel kinds read from the roles are those of the op
 *   lists tp.c used to hold (kept below as the reference), over gpt, llama,
 *   tied, LoRA and MLP models.
 * - The bf16 counts (one formula for the programs and the planner) are the
 *   formulas prog.c and plan.c used to write each (kept below), node by
 *   node, and the planner's per-rank figures are unchanged.
 * - The decode counts (cache, auxiliaries) are those decode.c used to
 *   write. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "bf16.h"
#include "decode.h"
#include "kernels.h"
#include "layout.h"
#include "ops.h"
#include "optable.h"
#include "plan.h"
#include "spec_json.h"
#include "tp.h"

/* ---- completeness ----------------------------------------------------------- */

static void test_rows_complete(void **st) {
  (void)st;
  for (int op = 0; op < PW_OP__COUNT; op++) {
    const pw_op_info *o = pw_op_info_of(op);
    const pw_kernel *k = pw_kernel_of(op);
    if (!o->name) fail_msg("op %d has no row in optable.c", op);
    assert_string_equal(pw_op_name((pw_op)op), o->name);
    for (int q = 0; q < op; q++)
      if (!strcmp(pw_op_info_of(q)->name, o->name)) fail_msg("ops %d and %d are both named %s", q, op, o->name);
    if (o->n_in < 1 || o->n_in > 2) fail_msg("%s: %d inputs", o->name, o->n_in);
    if (!k->forward) fail_msg("%s: no forward kernel in kernels.c", o->name);
    if (o->tp_role == PW_TP_ROLE_UNDECLARED || o->tp_role > PW_TP_ROLE_VOCAB_LOSS)
      fail_msg("%s: no tensor-parallel role declared (optable.c: .tp_role)", o->name);
    switch (o->decode) {
      case PW_DECODE_RUN:
        if (!k->decode) fail_msg("%s: the decode runs it, but kernels.c has no decode entry", o->name);
        if (o->is_loss) fail_msg("%s: a loss the decode runs (it hands out the loss's input)", o->name);
        break;
      case PW_DECODE_SKIP:
        if (!o->is_loss) fail_msg("%s: the decode skips only losses", o->name);
        /* fall through */
      case PW_DECODE_REFUSED:
        if (k->decode) fail_msg("%s: a decode entry the decode never calls", o->name);
        break;
      default: fail_msg("%s: no decode declared (optable.c: .decode)", o->name);
    }
    if (o->decode != PW_DECODE_RUN && (o->decode_pack || o->positions || o->decode_aux.coef || o->decode_kv.coef))
      fail_msg("%s: decode facts on an op the decode does not run", o->name);
    if (o->is_loss && o->tp_role != PW_TP_ROLE_WHOLE && o->tp_role != PW_TP_ROLE_VOCAB_LOSS)
      fail_msg("%s: a loss is whole or vocab-parallel", o->name);
    /* per-row and per-position counts have no rows of input 0 in them */
    const pw_op_count *per_row[] = {&o->decode_aux, &o->decode_kv, &o->bf16_weight, &o->bf16_scratch[1]};
    for (size_t c = 0; c < sizeof per_row / sizeof per_row[0]; c++)
      for (int d = 0; d < 3; d++)
        if (per_row[c]->d[d] == PW_DIM_ROWS) fail_msg("%s: a per-row count multiplies rows", o->name);
  }
}

/* ---- models ------------------------------------------------------------------- */

static pw_model_spec spec_of(int tmpl, int tied, int lora) {
  pw_model_spec s;
  memset(&s, 0, sizeof s);
  s.tmpl = tmpl;
  if (tmpl == PW_TEMPLATE_MLP) {
    s.in_dim = 5, s.hidden_dim = 7, s.out_dim = 3, s.n_layers = 3;
    s.activation = lora ? PW_ACT_RELU : PW_ACT_GELU, s.loss = PW_LOSS_MSE;
    return s;
  }
  s.vocab_size = 24, s.seq_len = 6, s.d_model = 12, s.n_layers = 3, s.n_heads = 2;
  s.ffn_hidden = 20, s.tie_embeddings = tied;
  if (lora) {
    s.lora_rank = 2, s.lora_alpha = 4, s.n_lora_targets = 2;
    snprintf(s.lora_targets[0], PW_LORA_TARGET_LEN, "blocks.*.attn.qkv");
    snprintf(s.lora_targets[1], PW_LORA_TARGET_LEN, "lm_head");
  }
  return s;
}

enum { N_MODELS = 7, N_ALL = 2 * N_MODELS }; /* each model with plain, then tiled attention */

static void model_of(int k, pw_model *m) {
  static const int tmpl[N_MODELS] = {PW_TEMPLATE_GPT,   PW_TEMPLATE_GPT, PW_TEMPLATE_LLAMA, PW_TEMPLATE_LLAMA,
                                     PW_TEMPLATE_GPT,   PW_TEMPLATE_MLP, PW_TEMPLATE_MLP};
  static const int tied[N_MODELS] = {0, 1, 0, 0, 1, 0, 0}, lora[N_MODELS] = {0, 0, 0, 1, 0, 0, 1};
  pw_model_spec s = spec_of(tmpl[k % N_MODELS], tied[k % N_MODELS], lora[k % N_MODELS]);
  pw_err err = {0};
  if (pw_model_build(&s, m, &err)) fail_msg("model %d: %s: %s", k, err.path, err.msg);
  if (k >= N_MODELS) pw_model_set_attention(m, PW_ATTN_TILED); /* the tiled attention's rows */
}

/* ---- tensor-parallel roles ---------------------------------------------------------- */

/* tp.c's kinds before the roles: the op lists, as they were. */
static int ref_consumer_op(const pw_model *m, int v) {
  for (int j = 0; j < m->n_nodes; j++)
    if (m->nodes[j].in[0] == v || m->nodes[j].in[1] == v) return m->nodes[j].op;
  return -1;
}

static void ref_kinds(const pw_model *m, uint8_t *kinds) {
  memset(kinds, PW_TP_REPLICATED, (size_t)m->n_params);
  for (int i = 0; i < m->n_nodes; i++) {
    const pw_node *n = &m->nodes[i];
    if (n->op == PW_OP_EMBED) kinds[n->w] = PW_TP_VOCAB;
    if (n->op != PW_OP_LINEAR) continue;
    int c = ref_consumer_op(m, n->out), pr = m->values[n->in[0]].producer;
    int p = pr >= 0 ? m->nodes[pr].op : -1;
    pw_tp_kind k = PW_TP_REPLICATED;
    if (c == PW_OP_ROPE || c == PW_OP_QKNORM || c == PW_OP_ATTENTION || c == PW_OP_ATTENTION_TILED) k = PW_TP_QKV;
    else if (c == PW_OP_XENT) k = PW_TP_VOCAB;
    else if (c == PW_OP_GELU || c == PW_OP_SWIGLU || c == PW_OP_RELU || c == PW_OP_SILU) k = PW_TP_COLUMN;
    else if (p == PW_OP_ATTENTION || p == PW_OP_ATTENTION_TILED || p == PW_OP_GELU || p == PW_OP_SWIGLU || p == PW_OP_RELU || p == PW_OP_SILU)
      k = PW_TP_ROW;
    kinds[n->w] = (uint8_t)k;
    if (n->b >= 0) kinds[n->b] = (uint8_t)(k == PW_TP_ROW ? PW_TP_REPLICATED : k);
  }
}

static void test_tp_roles(void **st) {
  (void)st;
  for (int k = 0; k < N_ALL; k++) {
    pw_model m;
    model_of(k, &m);
    uint8_t *got = malloc((size_t)m.n_params + 1), *want = malloc((size_t)m.n_params + 1);
    assert_non_null(got);
    assert_non_null(want);
    pw_tp_kinds(&m, got);
    ref_kinds(&m, want);
    int split = 0;
    for (int i = 0; i < m.n_params; i++) {
      if (got[i] != want[i])
        fail_msg("model %d, %s: %s from the roles, %s from the op lists", k, m.params[i].name,
                 pw_tp_kind_name((pw_tp_kind)got[i]), pw_tp_kind_name((pw_tp_kind)want[i]));
      split += got[i] != PW_TP_REPLICATED;
    }
    if (k % N_MODELS < 5 && split < 5) fail_msg("model %d: only %d split parameters", k, split); /* the lists were exercised */
    free(got), free(want);
    pw_model_free(&m);
  }
}

/* ---- bf16 ---------------------------------------------------------------------------- */

/* prog.c's and plan.c's counts before the table: a linear's weight copy
 * and rows x (C + OC) operands, attention's bf16.h scratch. */
static size_t ref_weight(const pw_node *n) {
  return n->op == PW_OP_LINEAR && n->w >= 0 ? (size_t)n->OC * (size_t)n->C : 0;
}

static size_t ref_scratch(const pw_model *m, const pw_node *n, int mb) {
  if (n->op == PW_OP_ATTENTION) return pw_attention_bf16_scratch(mb, n->T, n->C / 3);
  if (n->op == PW_OP_ATTENTION_TILED) return pw_attention_tiled_bf16_scratch(mb, n->T, n->C / 3);
  if (n->op != PW_OP_LINEAR || n->w < 0) return 0;
  return (size_t)mb * (size_t)m->values[n->in[0]].rows * (size_t)(n->C + n->OC);
}

static void test_bf16_counts(void **st) {
  (void)st;
  int checked = 0;
  for (int k = 0; k < N_ALL; k++) {
    pw_model m;
    model_of(k, &m);
    for (int mb = 1; mb <= 5; mb += 2)
      for (int i = 0; i < m.n_nodes; i++) {
        const pw_node *n = &m.nodes[i];
        size_t w = pw_op_bf16_weight(n), s = pw_op_bf16_scratch(n, &m.values[n->in[0]], mb);
        if (w != ref_weight(n) || s != ref_scratch(&m, n, mb))
          fail_msg("model %d, node %d (%s), mb %d: weight %zu scratch %zu, expected %zu and %zu", k, i,
                   pw_op_name((pw_op)n->op), mb, w, s, ref_weight(n), ref_scratch(&m, n, mb));
        checked += w > 0 || s > 0;
      }
    pw_model_free(&m);
  }
  assert_true(checked > 50);
}

static void job_of(const char *model, int pp, pw_job *job) {
  char buf[2048];
  int mlp = strstr(model, "mlp") != NULL;
  snprintf(buf, sizeof buf,
           "{\"name\": \"t\", \"model\": {%s}, \"mesh\": {\"pp\": %d}, \"schedule\": {\"name\": \"1f1b\", "
           "\"microbatches\": 4}, \"partition\": {\"mode\": \"even\"}, \"train\": {\"steps\": 1, \"batch_size\": 12, "
           "\"precision\": \"bf16\"}, \"data\": {\"kind\": \"%s\"%s}}",
           model, pp, mlp ? "regression" : "text", mlp ? "" : ", \"path\": \"examples/data/corpus.txt\"");
  json_t *j = json_loads(buf, 0, NULL);
  assert_non_null(j);
  pw_err err = {0};
  if (pw_job_parse(j, NULL, job, &err)) fail_msg("%s: %s: %s", buf, err.path, err.msg);
  json_decref(j);
}

/* The planner's bf16 bytes of each rank: the fp32 plan's scratch plus, per
 * stage, (its weight copies + the widest node's operands) x 2 bytes, the
 * counts as plan.c wrote them. */
static void test_bf16_plan_unchanged(void **st) {
  (void)st;
  static const char *const models[] = {
      "\"template\": \"gpt\", \"vocab_size\": 256, \"seq_len\": 8, \"d_model\": 24, \"n_layers\": 4, \"n_heads\": 2",
      "\"template\": \"gpt\", \"vocab_size\": 256, \"seq_len\": 8, \"d_model\": 24, \"n_layers\": 3, \"n_heads\": 2,"
      " \"tie_embeddings\": true",
      "\"template\": \"llama\", \"vocab_size\": 256, \"seq_len\": 8, \"d_model\": 24, \"n_layers\": 3, \"n_heads\": 2,"
      " \"ffn_hidden\": 40",
      "\"template\": \"llama\", \"vocab_size\": 256, \"seq_len\": 8, \"d_model\": 24, \"n_layers\": 3, \"n_heads\": 2,"
      " \"lora\": {\"rank\": 2, \"alpha\": 4, \"targets\": [\"blocks.*.attn.qkv\", \"lm_head\"]}",
      "\"template\": \"mlp\", \"in_dim\": 12, \"hidden_dim\": 40, \"n_layers\": 3, \"out_dim\": 5,"
      " \"activation\": \"gelu\", \"loss\": \"mse\"",
  };
  for (size_t k = 0; k < 2 * sizeof models / sizeof models[0]; k++)
    for (int pp = 1; pp <= 2; pp++) {
      pw_job job;
      pw_plan f32, b16;
      pw_err err = {0};
      job_of(models[k / 2], pp, &job);
      if (k % 2) job.train.attention = PW_ATTN_TILED; /* and with the tiled attention */
      if (pw_plan_build(&job, NULL, &b16, &err)) fail_msg("model %zu: %s: %s", k, err.path, err.msg);
      job.train.precision = PW_PRECISION_FP32;
      assert_int_equal(pw_plan_build(&job, NULL, &f32, &err), 0);
      size_t *want = calloc((size_t)pp, sizeof *want);
      assert_non_null(want);
      const pw_model *m = &b16.model;
      for (int s = 0; s < b16.S; s++) {
        const pw_stage *sg = &b16.part.stages[s];
        size_t wb = 0, sc = 0;
        for (int i = m->layers[sg->layer_lo].node_lo; i < m->layers[sg->layer_hi - 1].node_hi; i++) {
          size_t a = ref_scratch(m, &m->nodes[i], b16.mb_size);
          wb += ref_weight(&m->nodes[i]);
          if (a > sc) sc = a;
        }
        want[b16.sched->stage_to_rank[s]] += (wb + sc) * 2;
      }
      for (int r = 0; r < pp; r++)
        if (b16.mem[r].scratch != f32.mem[r].scratch + want[r])
          fail_msg("model %zu, pp %d, rank %d: bf16 scratch %zu, expected %zu + %zu", k, pp, r, b16.mem[r].scratch,
                   f32.mem[r].scratch, want[r]);
      free(want);
      pw_plan_free(&f32);
      pw_plan_free(&b16);
      pw_job_free(&job);
    }
}

/* ---- attention's scratch and auxiliaries ------------------------------------------ */

/* The op table's counts are the kernels' own (ops.h, bf16.h): the plain
 * attention saves its (NH, T, T) probabilities and needs T x T of scratch,
 * the tiled one saves (NH, T) and needs pw_attention_tiled_scratch; the
 * program's scratch is the largest node's. */
static void test_attention_counts(void **st) {
  (void)st;
  int seen[2] = {0, 0};
  for (int k = 0; k < N_ALL; k++) {
    pw_model m;
    model_of(k, &m);
    size_t most = 1;
    for (int i = 0; i < m.n_nodes; i++) {
      const pw_node *n = &m.nodes[i];
      size_t want = 0, aux = n->aux;
      if (n->op == PW_OP_ATTENTION) {
        want = (size_t)n->T * n->T;
        assert_int_equal(aux, (size_t)n->NH * n->T * n->T);
      } else if (n->op == PW_OP_ATTENTION_TILED) {
        want = pw_attention_tiled_scratch(n->T, n->C / 3, n->NH, n->NH);
        assert_int_equal(aux, (size_t)n->NH * n->T);
      }
      if (n->op == PW_OP_ATTENTION || n->op == PW_OP_ATTENTION_TILED) seen[n->op == PW_OP_ATTENTION_TILED]++;
      assert_int_equal(pw_op_scratch(n), want);
      most = want > most ? want : most;
    }
    pw_prog_sizes sz;
    assert_int_equal(pw_prog_sizes_of(&m, 0, m.n_layers, 2, &sz), 0);
    assert_int_equal(sz.scratch_floats, most);
    pw_model_free(&m);
  }
  assert_true(seen[0] > 0 && seen[1] > 0);
}

/* ---- decode --------------------------------------------------------------------------- */

/* decode.c's counts before the table: attention's K and V (C / 3 each per
 * position), and the auxiliaries per row: gelu's C, LoRA's h, a layernorm's
 * mean and rstd, an rmsnorm's rstd. */
static size_t ref_kv(const pw_node *n) {
  return n->op == PW_OP_ATTENTION || n->op == PW_OP_ATTENTION_TILED ? 2 * (size_t)(n->C / 3) : 0;
}

static size_t ref_aux(const pw_node *n) {
  switch ((pw_op)n->op) {
    case PW_OP_GELU: return (size_t)n->C;
    case PW_OP_LORA: return (size_t)n->NH;
    case PW_OP_LAYERNORM: return 2;
    case PW_OP_RMSNORM: return 1;
    default: return 0;
  }
}

static void test_decode_counts(void **st) {
  (void)st;
  for (int k = 0; k < N_ALL; k++) {
    pw_model m;
    model_of(k, &m);
    for (int i = 0; i < m.n_nodes; i++) {
      const pw_node *n = &m.nodes[i];
      if (pw_op_decode_kv(n) != ref_kv(n) || pw_op_decode_aux(n) != ref_aux(n))
        fail_msg("model %d, node %d (%s): kv %zu aux %zu per row, expected %zu and %zu", k, i,
                 pw_op_name((pw_op)n->op), pw_op_decode_kv(n), pw_op_decode_aux(n), ref_kv(n), ref_aux(n));
    }
    for (int lo = 0; lo < m.n_layers; lo++)
      for (int hi = lo + 1; hi <= m.n_layers; hi++) {
        size_t want = 0;
        for (int i = m.layers[lo].node_lo; i < m.layers[hi - 1].node_hi; i++) want += 5 * ref_kv(&m.nodes[i]);
        assert_int_equal(pw_decode_kv_floats(&m, lo, hi, 5), want);
      }
    pw_model_free(&m);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rows_complete),     cmocka_unit_test(test_tp_roles),
      cmocka_unit_test(test_bf16_counts),       cmocka_unit_test(test_bf16_plan_unchanged),
      cmocka_unit_test(test_decode_counts),     cmocka_unit_test(test_attention_counts),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

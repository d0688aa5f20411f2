/* cmd_inspect: `pipewright inspect` — the layers of a job's model. */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "args.h"
#include "cli.h"
#include "model.h"
#include "spec.h"

static void shape_str(const pw_model *m, int v, char *buf, int cap) {
  const pw_value *x = &m->values[v];
  if (x->role == PW_VAL_LOSS)
    snprintf(buf, (size_t)cap, "scalar");
  else if (x->rows > 1)
    snprintf(buf, (size_t)cap, "(B,%d,%d)", x->rows, x->width);
  else
    snprintf(buf, (size_t)cap, "(B,%d)", x->width);
}

#define USAGE "usage: pipewright inspect --job FILE [--nodes]\n"

int pw_cmd_inspect(int argc, char **argv) {
  static const struct option opts[] = {{"job", required_argument, 0, 'j'},
                                       {"nodes", no_argument, 0, 'n'},
                                       {"help", no_argument, 0, 'h'},
                                       {0, 0, 0, 0}};
  const char *job_path = NULL;
  int nodes = 0, c;
  optind = 1;
  while ((c = pw_getopt(argc, argv, "j:nh", opts)) != -1) {
    if (c == 'j') job_path = optarg;
    else if (c == 'n') nodes = 1;
    else if (c == 'h') return fputs(USAGE, stdout), 0;
    else return fputs(USAGE, stderr), 2;
  }
  if (pw_args_operands(argc, argv, 0, 0, NULL) || pw_args_required(job_path, "--job FILE"))
    return fputs(USAGE, stderr), 2;
  pw_job job;
  if (pw_cli_load_job(job_path, &job)) return 1;
  pw_model m;
  pw_err err = {0};
  if (pw_model_build(&job.model, &m, &err)) {
    pw_cli_report(&err);
    pw_job_free(&job);
    return 1;
  }
  pw_model_set_attention(&m, job.train.attention);
  char a[32], b[32], d[32], e[32], f[32], sh[48];
  printf("%-4s %-12s %-16s %10s %10s %10s %10s %10s\n", "#", "layer", "output", "params", "fwd FLOPs",
         "bwd FLOPs", "act bytes", "out bytes");
  printf("%-4s %-12s %-16s %10s %10s %10s %10s %10s\n", "", "", "", "", "per seq", "per seq", "per seq", "per seq");
  double tp = 0, tf = 0, tb = 0, ta = 0;
  for (int i = 0; i < m.n_layers; i++) {
    const pw_layer *l = &m.layers[i];
    for (int k = 0; k < m.n_markers; k++)
      if (m.markers[k] == i) printf("---- stage boundary ----\n");
    if (job.model.n_regions && (i == 0 || m.layers[i - 1].region != l->region)) /* a regions model */
      printf("==== region %s ====\n", job.model.regions[l->region].name);
    shape_str(&m, m.nodes[l->node_hi - 1].out, sh, sizeof sh);
    printf("%-4d %-12s %-16s %10s %10s %10s %10s %10s\n", i, l->name, sh, pw_cli_si((double)l->params, a, 32),
           pw_cli_si(l->flops_f, b, 32), pw_cli_si(l->flops_i + l->flops_w, d, 32),
           pw_cli_si((double)l->act_bytes, e, 32), pw_cli_si((double)l->out_bytes, f, 32));
    if (nodes)
      for (int n = l->node_lo; n < l->node_hi; n++) {
        const pw_node *nd = &m.nodes[n];
        shape_str(&m, nd->out, sh, sizeof sh);
        printf("       %-15s -> %-16s %s%s\n", pw_op_name((pw_op)nd->op), sh, nd->w >= 0 ? m.params[nd->w].name : "",
               nd->b >= 0 ? " +bias" : "");
      }
    tp += (double)l->params;
    tf += l->flops_f;
    tb += l->flops_i + l->flops_w;
    ta += (double)l->act_bytes;
  }
  printf("%-4s %-12s %-16s %10s %10s %10s %10s\n", "", "total", "", pw_cli_si(tp, a, 32), pw_cli_si(tf, b, 32),
         pw_cli_si(tb, d, 32), pw_cli_si(ta, e, 32));
  printf("\n%d layers, %d ops, %d parameter tensors, %zu parameters; per step: %s FLOPs (batch %d, seq %d)\n",
         m.n_layers, m.n_nodes, m.n_params, pw_model_param_count(&m),
         pw_cli_si((tf + tb) * job.train.batch_size, a, 32), job.train.batch_size, m.seq_len);
  pw_model_free(&m);
  pw_job_free(&job);
  return 0;
}

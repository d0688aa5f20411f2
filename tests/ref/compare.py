"""compare: check a pipewright run against the PyTorch reference run.

    compare.py --a-losses PW.jsonl --a-final PW.safetensors \
               --b-losses REF.jsonl --b-final REF.safetensors [--label NAME]

A is pipewright, B the reference (torch_ref.py). Checks, and prints:
  - the same steps in both logs, in order;
  - per step: |loss_a - loss_b| / |loss_b|          <= --loss-rtol (1e-4)
              |lr_a - lr_b| / lr_b                  <= --lr-rtol (1e-6)
              |gn_a - gn_b| / gn_b                  <= --gn-rtol (1e-3)
  - the same tensor names, shapes and dtypes in both final checkpoints;
  - per tensor: max|a - b| / (max|b| + 1e-8)        <= --weight-rtol (1e-3)
    (the largest elementwise difference, relative to the tensor's scale:
    an elementwise ratio would blow up on entries that are ~0 by chance,
    such as the k part of attn.qkv.bias, whose gradient is zero in exact
    arithmetic and which Adam moves by rounding noise alone).
Exit status 1 on any mismatch, 2 on unreadable input. compare() is the same
check as a function (torch_ref.py --self-check uses it on a wrong run).
"""
import argparse
import json
import os
import sys

import numpy as np

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st  # noqa: E402


def read_log(path):
    recs = []
    with open(path) as f:
        for ln, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                print(f"compare: {path}:{ln}: not JSON: {e}", file=sys.stderr)
                sys.exit(2)
            for k in ("step", "loss", "lr", "grad_norm"):
                if not isinstance(r, dict) or k not in r:
                    print(f"compare: {path}:{ln}: missing key {k!r}", file=sys.stderr)
                    sys.exit(2)
            recs.append(r)
    return recs


def rel(a, b):
    return abs(a - b) / abs(b) if b != 0 else abs(a - b)


def compare(la, lb, ta, tb, label="", loss_rtol=1e-4, lr_rtol=1e-6, gn_rtol=1e-3,
            weight_rtol=1e-3, out=sys.stdout):
    """Compare run a (logs la, final tensors ta) with run b; prints the
    tables to `out` and returns the list of failures (empty when they agree)."""
    def p(*args):
        print(*args, file=out)
    failures = []
    p(f"== {label}: per-step comparison (a = pipewright, b = torch reference)")
    p(f"{'step':>4} {'loss a':>12} {'loss b':>12} {'rel':>9}  {'lr a':>10} {'lr b':>10}"
      f"  {'gnorm a':>10} {'gnorm b':>10} {'rel':>9}")
    if [r["step"] for r in la] != [r["step"] for r in lb]:
        failures.append(f"step lists differ: a {[r['step'] for r in la]} b {[r['step'] for r in lb]}")
    worst_loss = 0.0
    for ra, rb in zip(la, lb):
        lr_ = rel(ra["loss"], rb["loss"])
        lrr = rel(ra["lr"], rb["lr"])
        gr = rel(ra["grad_norm"], rb["grad_norm"])
        worst_loss = max(worst_loss, lr_)
        flag = ""
        if not lr_ <= loss_rtol:
            flag += " LOSS"
        if not lrr <= lr_rtol:
            flag += " LR"
        if not gr <= gn_rtol:
            flag += " GNORM"
        p(f"{rb['step']:>4} {ra['loss']:>12.7f} {rb['loss']:>12.7f} {lr_:>9.2e}  {ra['lr']:>10.3e} "
          f"{rb['lr']:>10.3e}  {ra['grad_norm']:>10.5f} {rb['grad_norm']:>10.5f} {gr:>9.2e}{flag}")
        if flag:
            failures.append(f"step {rb['step']}:{flag.lower()} outside tolerance")
    if not la:
        failures.append("no steps logged")
    if set(ta) != set(tb):
        failures.append(f"tensor names differ: only in a {sorted(set(ta) - set(tb))}, "
                        f"only in b {sorted(set(tb) - set(ta))}")
    rows = []
    for n in sorted(set(ta) & set(tb)):
        x, y = np.asarray(ta[n]), np.asarray(tb[n])
        if x.shape != y.shape or x.dtype != y.dtype:
            failures.append(f"{n}: a {x.dtype}{list(x.shape)} vs b {y.dtype}{list(y.shape)}")
            continue
        x64, y64 = x.astype(np.float64), y.astype(np.float64)
        if not np.all(np.isfinite(x64)):
            failures.append(f"{n}: non-finite values in a")
            continue
        d = np.abs(x64 - y64)
        dmax = float(d.max()) if d.size else 0.0
        bmax = float(np.abs(y64).max()) if d.size else 0.0
        err = dmax / (bmax + 1e-8)
        rows.append((err, n, dmax, bmax))
        if not err <= weight_rtol:
            failures.append(f"{n}: max|a-b|/max|b| = {err:.3e} > {weight_rtol:g}")
    rows.sort(reverse=True)
    p(f"== {label}: final weights, max|a-b|/(max|b|+1e-8) per tensor, worst first")
    for err, n, dmax, bmax in rows[:5]:
        p(f"   {n:32s} {err:9.2e}   (max|a-b| {dmax:.3e}, max|b| {bmax:.3e})")
    p(f"== {label}: worst loss rel {worst_loss:.2e} (tol {loss_rtol:g}), worst tensor "
      f"{rows[0][1] if rows else '-'} {rows[0][0] if rows else 0:.2e} (tol {weight_rtol:g})")
    if failures:
        p(f"== {label}: FAIL")
        for f in failures:
            p("   " + f)
    else:
        p(f"== {label}: ok")
    return failures


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--a-losses", required=True)
    ap.add_argument("--a-final", required=True)
    ap.add_argument("--b-losses", required=True)
    ap.add_argument("--b-final", required=True)
    ap.add_argument("--label", default="")
    ap.add_argument("--loss-rtol", type=float, default=1e-4)
    ap.add_argument("--lr-rtol", type=float, default=1e-6)
    ap.add_argument("--gn-rtol", type=float, default=1e-3)
    ap.add_argument("--weight-rtol", type=float, default=1e-3)
    a = ap.parse_args()
    la, lb = read_log(a.a_losses), read_log(a.b_losses)
    try:
        ta, _ = st.load(a.a_final)
        tb, _ = st.load(a.b_final)
    except (OSError, st.SafetensorsError) as e:
        print(f"compare: {e}", file=sys.stderr)
        sys.exit(2)
    if compare(la, lb, ta, tb, a.label, a.loss_rtol, a.lr_rtol, a.gn_rtol, a.weight_rtol):
        sys.exit(1)


if __name__ == "__main__":
    main()

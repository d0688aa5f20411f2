#!/usr/bin/env python3
"""compare_run: a pipelined run (driver.py's result.json and merged
checkpoint) against the single-process trainer (its --log-json and --out):
per-step losses and every final parameter to a relative tolerance (a 6th
argument: another one for the parameters). Per tensor the error is
max|a-b| / max|b|. Exit 1 on any mismatch."""
import json, os, sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ref"))
import numpy as np  # noqa: E402
import st  # noqa: E402


def main():
    result, ref_log, ref_ckpt = sys.argv[1], sys.argv[2], sys.argv[3]
    tol = float(sys.argv[4]) if len(sys.argv) > 4 else 1e-5
    start = int(sys.argv[5]) if len(sys.argv) > 5 else 0   # a resumed run's first step
    wtol = float(sys.argv[6]) if len(sys.argv) > 6 else tol
    r = json.load(open(result))
    ref = [json.loads(l) for l in open(ref_log)][start:]
    bad = []
    for e in ref:
        k = str(e["step"])
        got = r["losses"].get(k)
        if got is None or abs(got - e["loss"]) > tol * abs(e["loss"]):
            bad.append(f"step {k}: loss {got} vs single-process {e['loss']}")
    a, _ = st.load(r["merged"])
    b, _ = st.load(ref_ckpt)
    if set(a) != set(b):
        bad.append(f"tensor names differ: only pipelined {sorted(set(a) - set(b))}, only single {sorted(set(b) - set(a))}")
    worst = (0.0, "")
    for name in sorted(set(a) & set(b)):
        x, y = np.asarray(a[name], np.float64), np.asarray(b[name], np.float64)
        if x.shape != y.shape:
            bad.append(f"{name}: shape {x.shape} vs {y.shape}")
            continue
        err = float(np.max(np.abs(x - y)) / (np.max(np.abs(y)) + 1e-30))
        worst = max(worst, (err, name))
        if err > wtol:
            bad.append(f"{name}: relative error {err:.3g} > {wtol}")
    print(f"compare: {len(ref)} steps from {start}, {len(b)} tensors, worst tensor {worst[1]} {worst[0]:.3g}, "
          f"last loss {r['losses'].get(str(ref[-1]['step']))} vs {ref[-1]['loss']}")
    for m in bad[:20]:
        print("  MISMATCH", m)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

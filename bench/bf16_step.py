"""bf16_step: the d512 bench GPT's training step, train.precision "bf16" against
float32 and against PyTorch's bf16 autocast on CPU (issue 18), one thread each.

    /usr/bin/python3 bench/bf16_step.py [--build DIR] [--job JOB] [--rounds N] [--warmup W]

Six step servers stay resident (bench_step and torch_step.py --serve, the
protocol of bench/harness.py case 2) and take one step each per round, in
an order that rotates every round, so load from other processes hits all of
them alike:
  pw-fp32-haswell  pipewright float32, OPENBLAS_CORETYPE=Haswell (CI's forced AVX2)
  pw-fp32-native   pipewright float32, OPENBLAS_CORETYPE unset (AVX-512 sgemm here)
  pw-bf16-haswell  pipewright train.precision "bf16" (oneDNN's AVX512_BF16 matmul),
                   OPENBLAS_CORETYPE=Haswell
  pw-bf16-native   the same with OpenBLAS's own kernels (since attention's products
                   run in bf16 too, a bf16 step calls no sgemm: the two should agree)
  torch-fp32       PyTorch float32 (at its best: the multi-tensor AdamW, benchlib.torch_cmd)
  torch-bf16       the same with forward and loss under torch.autocast("cpu", torch.bfloat16)
Prints the median ms per step with min-max, and the ratios as medians of
the per-round ratios with their range; the load average before and after
(the machine may be shared: indicative).
"""
import argparse
import atexit
import json
import os
import shutil
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from benchlib import Server, env_for, loadavg, spread, torch_cmd  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build-bench"))
    ap.add_argument("--job", default=os.path.join(HERE, "jobs", "gpt-d512.json"))
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--warmup", type=int, default=2)
    a = ap.parse_args()
    spec = json.load(open(a.job))
    tmp = tempfile.mkdtemp(prefix="pw-bf16-step-")
    atexit.register(shutil.rmtree, tmp, True)  # ranks' state and checkpoints: gigabytes
    jobs = {}
    for prec in ("fp32", "bf16"):
        s = json.loads(json.dumps(spec))
        s["train"]["precision"] = prec
        s["data"]["path"] = os.path.join(ROOT, s["data"]["path"])
        jobs[prec] = os.path.join(tmp, f"{prec}.json")
        json.dump(s, open(jobs[prec], "w"))
    step = os.path.join(a.build, "bench", "bench_step")
    cmds = {
        "pw-fp32-haswell": ([step, "--job", jobs["fp32"], "--threads", "1"], env_for(1, "Haswell")),
        "pw-fp32-native": ([step, "--job", jobs["fp32"], "--threads", "1"], env_for(1, "auto")),
        "pw-bf16-haswell": ([step, "--job", jobs["bf16"], "--threads", "1"], env_for(1, "Haswell")),
        "pw-bf16-native": ([step, "--job", jobs["bf16"], "--threads", "1"], env_for(1, "auto")),
        "torch-fp32": (torch_cmd(a.job, 1), env_for(1, None)),
        "torch-bf16": (torch_cmd(a.job, 1) + ["--autocast"], env_for(1, None)),
    }
    la0 = loadavg()
    servers = {k: Server(c, e) for k, (c, e) in cmds.items()}
    names = list(servers)
    ms = {k: [] for k in names}
    loss = {k: [] for k in names}
    try:
        for r in range(a.warmup + a.rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for k in order:
                out = servers[k].cmd("step")
                if r >= a.warmup:
                    ms[k].append(out["ms"])
                loss[k].append(out["loss"])
    finally:
        for s in servers.values():
            s.close()
    la1 = loadavg()
    med = {k: statistics.median(v) for k, v in ms.items()}
    print(f"job {os.path.relpath(a.job, ROOT)}; {a.rounds} rounds after {a.warmup} warm-up, one thread each;"
          f" load average {la0} before, {la1} after")
    print("| variant | ms/step median (min-max) | loss after the last step |")
    print("|---|---|---|")
    for k in names:
        print(f"| {k} | {med[k]:.0f} ({min(ms[k]):.0f}-{max(ms[k]):.0f}) | {loss[k][-1]:.4f} |")

    def ratio(slow, fast):
        """How many times faster `fast` is: the median of the per-round ratios (min-max)."""
        r = [x / y for x, y in zip(ms[slow], ms[fast])]
        lo, hi = spread(r)
        return f"{statistics.median(r):.2f}x ({lo:.2f}-{hi:.2f})"

    for ct in ("haswell", "native"):
        print(f"OpenBLAS {ct}: pw-bf16 vs pw-fp32 {ratio(f'pw-fp32-{ct}', f'pw-bf16-{ct}')};"
              f" pw-bf16 vs torch-bf16 (autocast) {ratio('torch-bf16', f'pw-bf16-{ct}')}")
    print(f"pw-bf16-haswell vs pw-fp32-native: {ratio('pw-fp32-native', 'pw-bf16-haswell')}")
    print(f"torch-bf16 vs torch-fp32: {ratio('torch-fp32', 'torch-bf16')}")


if __name__ == "__main__":
    main()

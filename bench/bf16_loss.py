"""bf16_loss: train.precision "bf16" trains as well as float32 (issue 18).

    python3 bench/bf16_loss.py [--build DIR] [--job JOB] [--steps N]

Trains the README's example job (examples/jobs/gpt-tiny.json, 300 steps)
with `pipewright train` twice, float32 and bf16, side by side (a pipelined
run of the same job computes the same bits: tests/integration/
test_bf16_pipeline.py), and asserts that bf16's loss is within 2 % of
float32's: at the last step, and averaged over the last 20 steps (the
per-step loss of one batch is noisy). Exit 1 when it is not. Prints both
curves every 50 steps.
"""
import argparse
import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build-bench"))
    ap.add_argument("--job", default=os.path.join(ROOT, "examples", "jobs", "gpt-tiny.json"))
    ap.add_argument("--steps", type=int, default=300)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="pw-bf16-loss-")
    atexit.register(shutil.rmtree, tmp, True)  # ranks' state and checkpoints: gigabytes
    procs, logs = {}, {}
    for prec in ("fp32", "bf16"):
        s = json.load(open(a.job))
        s["train"]["precision"] = prec
        s["train"]["steps"] = a.steps
        s["train"]["checkpoint_every"] = 0
        s["data"]["path"] = os.path.join(os.path.dirname(os.path.abspath(a.job)), "..", "data",
                                         os.path.basename(s["data"]["path"]))
        path = os.path.join(tmp, f"{prec}.json")
        json.dump(s, open(path, "w"))
        logs[prec] = os.path.join(tmp, f"{prec}.jsonl")
        procs[prec] = subprocess.Popen([os.path.join(a.build, "pipewright"), "train", "--job", path, "--quiet",
                                        "--log-json", logs[prec], "--out", os.path.join(tmp, f"{prec}.safetensors")],
                                       env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
    for p in procs.values():
        if p.wait():
            sys.exit("bf16_loss: a training run failed")
    loss = {k: [json.loads(line)["loss"] for line in open(v)] for k, v in logs.items()}
    print("| step | float32 loss | bf16 loss |")
    print("|---|---|---|")
    for i in list(range(0, a.steps, 50)) + [a.steps - 1]:
        print(f"| {i + 1} | {loss['fp32'][i]:.4f} | {loss['bf16'][i]:.4f} |")
    last = abs(loss["bf16"][-1] - loss["fp32"][-1]) / loss["fp32"][-1]
    n = min(20, a.steps)
    mf, mb = sum(loss["fp32"][-n:]) / n, sum(loss["bf16"][-n:]) / n
    mean = abs(mb - mf) / mf
    print(f"last step: bf16 {loss['bf16'][-1]:.4f} vs float32 {loss['fp32'][-1]:.4f} ({100 * last:.2f} %);"
          f" mean of the last {n}: {mb:.4f} vs {mf:.4f} ({100 * mean:.2f} %)")
    ok = last < 0.02 and mean < 0.02
    print("bf16 within 2 % of float32:", "yes" if ok else "NO")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

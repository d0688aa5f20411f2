#!/usr/bin/env python3
"""zero_step: what train.zero 2's exchange inside the W and B actions costs
a step, against zero 1 (whose exchange is one reduce-scatter and one
all-gather at the step end), side by side in one run.

A GPT d512, 8 layers, seq 128, vocab 256 at pp 1 x dp 2, 1f1b with 4
microbatches of one sequence per replica, AdamW, 1-thread workers on this
host. Rounds interleave every (build, zero) pair; a run's step period is the
median wall time between consecutive steps' last reports after 2 warm-up
steps. Per build: the median over rounds of zero 2's period over zero 1's
in the same round, with the rounds' range. With two builds (--build A
--build B: e.g. before and after a change) also B's zero 2 period over A's,
paired per round.

  bench/zero_step.py [--build DIR ...] [--rounds 3] [--steps 7] [--out NAME]

Writes bench/results/zero/NAME.{json,md} (default step) and prints the
markdown."""
import argparse, json, os, shutil, statistics, sys, tempfile, time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import pipe  # noqa: E402


def job(zero, steps):
    return {"name": f"zero-step-z{zero}",
            "model": {"template": "gpt", "vocab_size": 256, "seq_len": 128, "d_model": 512, "n_layers": 8,
                      "n_heads": 8, "tie_embeddings": False},
            "mesh": {"pp": 1, "dp": 2, "virtual_stages": 1},
            "schedule": {"name": "1f1b", "microbatches": 4},
            "train": {"steps": steps, "batch_size": 8, "seed": 1, "grad_clip": 1.0, "checkpoint_every": 0,
                      "snapshot_every": 0, "zero": zero,
                      "optimizer": {"name": "adamw", "lr": 3e-4, "warmup_steps": 1, "weight_decay": 0.1}},
            "data": {"kind": "text", "path": os.path.join(ROOT, "examples/data/corpus.txt"), "sampler": "sequential"}}


def spread(v):
    return f"{statistics.median(v):.3f} ({min(v):.3f}-{max(v):.3f})"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", action="append")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=7)
    ap.add_argument("--out", default="step")
    a = ap.parse_args()
    builds = [os.path.abspath(b) for b in (a.build or [os.path.join(ROOT, "build-release")])]
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    period = {(b, z): [] for b in builds for z in (1, 2)}
    load0, t0 = os.getloadavg()[0], time.time()
    scratch = tempfile.mkdtemp(prefix="pw-zero-step-")
    try:
        for rd in range(a.rounds):
            for b in builds:
                for z in (1, 2):
                    out = os.path.join(scratch, f"r{rd}-{len(period[(b, z)])}-{os.path.basename(b)}-z{z}")
                    res = pipe.run(b, job(z, a.steps), out, trace_every=0, env=env)
                    period[(b, z)].append(pipe.step_period(res, 2))
                    shutil.rmtree(out, ignore_errors=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    L = [f"# ZeRO-2's in-action exchange against ZeRO-1 (bench/zero_step.py)\n",
         f"{time.strftime('%Y-%m-%d %H:%M:%S')}; GPT d512 L8 T128 (25 M parameters), pp 1 x dp 2, 1f1b m 4, one "
         f"sequence per microbatch, AdamW, 1-thread workers; {a.rounds} interleaved rounds of {a.steps} steps "
         f"(2 warm-up); load average {load0:.1f} at the start, {os.getloadavg()[0]:.1f} at the end "
         f"({time.time() - t0:.0f} s). Step period in seconds, median (range) over rounds; ratios paired per "
         f"round.\n",
         "| build | zero 1 step | zero 2 step | zero 2 / zero 1 |", "|---|---|---|---|"]
    rows = []
    for b in builds:
        r = [p2 / p1 for p1, p2 in zip(period[(b, 1)], period[(b, 2)])]
        rows.append({"build": b, "zero1_s": period[(b, 1)], "zero2_s": period[(b, 2)], "ratio": r})
        L.append(f"| {os.path.basename(b)} | {spread(period[(b, 1)])} | {spread(period[(b, 2)])} | {spread(r)} |")
    if len(builds) == 2:
        x = [q / p for p, q in zip(period[(builds[0], 2)], period[(builds[1], 2)])]
        L.append(f"\nzero 2 step, {os.path.basename(builds[1])} / {os.path.basename(builds[0])}: {spread(x)}")
    text = "\n".join(L) + "\n"
    print(text)
    os.makedirs(os.path.join(HERE, "results", "zero"), exist_ok=True)
    with open(os.path.join(HERE, "results", "zero", a.out + ".md"), "w") as f:
        f.write(text)
    with open(os.path.join(HERE, "results", "zero", a.out + ".json"), "w") as f:
        json.dump({"rows": rows, "rounds": a.rounds, "steps": a.steps}, f, indent=1)


if __name__ == "__main__":
    main()

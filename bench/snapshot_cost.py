#!/usr/bin/env python3
"""snapshot_cost: what in-memory snapshots (train.snapshot_every, issue 15)
cost a training step.

The d256 bench GPT (bench/jobs/gpt-d256.json) as a pp = 2 pipeline of two
1-thread workers (zb-h1, 8 microbatches), run with snapshot_every 1 (a copy
of each rank's stage state after every step, kept and sent to the other
rank) and with snapshot_every 0 (none), in alternating rounds (A B B A ...)
on fresh workers. Per run: the median wall time between consecutive steps
after the warm-up. Reported: the median of the per-round ratios (with 1 /
without) and their min-max, and the bytes each rank copies and sends per
snapshot (parameters + AdamW m + v of its stages).

  bench/snapshot_cost.py [--build DIR] [--rounds 4] [--steps 14] [--warmup 3] [--native] [--model d768]

--native unsets OPENBLAS_CORETYPE (this environment forces Haswell's AVX2
kernels; the CPU's own run sgemm about twice as fast, so the snapshot's
fixed cost weighs more). Writes bench/results/snapshot/MODEL[-native].{json,md}
and prints the markdown."""
import argparse, atexit, json, os, shutil, statistics, sys, tempfile, time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import pipe  # noqa: E402


def job(every, steps, model="d256"):
    j = json.load(open(os.path.join(HERE, "jobs", f"gpt-{model}.json")))
    j["name"] = f"snapshot-every-{every}"
    j["mesh"] = {"pp": 2, "dp": 1, "virtual_stages": 1}
    j["schedule"] = {"name": "zb-h1", "microbatches": 8}
    j["train"].update(steps=steps, snapshot_every=every)
    j["data"]["path"] = os.path.join(ROOT, j["data"]["path"])
    return j


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build-bench"))
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=14)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--native", action="store_true", help="OpenBLAS picks its kernels for this CPU")
    ap.add_argument("--model", default="d256", help="bench/jobs/gpt-MODEL.json (d256, d512, d768)")
    a = ap.parse_args()
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    if a.native:
        env.pop("OPENBLAS_CORETYPE", None)
    scratch = tempfile.mkdtemp(prefix="pw-snap-")
    atexit.register(shutil.rmtree, scratch, True)  # ranks' state and checkpoints: gigabytes
    periods = {0: [], 1: []}
    bytes_per_rank = None
    for rnd in range(a.rounds):
        order = (1, 0) if rnd % 2 == 0 else (0, 1)  # A B, B A, ...
        for every in order:
            res = pipe.run(a.build, job(every, a.steps, a.model), os.path.join(scratch, f"r{rnd}-e{every}"),
                           trace_every=0, env=env, timeout=1200)
            p = pipe.step_period(res, a.warmup)
            periods[every].append(p)
            if every and bytes_per_rank is None:
                bytes_per_rank = [r["memory"]["params"] * 3 for r in res["plan"]["analytics"]["ranks"]]
            print(f"round {rnd}: snapshot_every {every}: {p * 1e3:.1f} ms/step", file=sys.stderr, flush=True)
    ratios = [w / wo for w, wo in zip(periods[1], periods[0])]
    out = {
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "model": f"bench/jobs/gpt-{a.model}.json as pp = 2 (zb-h1, m = 8), two 1-thread workers",
        "coretype": env.get("OPENBLAS_CORETYPE", "(unset: the CPU's own kernels)"),
        "rounds": a.rounds, "steps": a.steps, "warmup": a.warmup,
        "ms_with": [x * 1e3 for x in periods[1]], "ms_without": [x * 1e3 for x in periods[0]],
        "ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
        "snapshot_bytes_per_rank": bytes_per_rank,
    }
    md = [
        "# In-memory snapshot cost (issue 15)", "",
        f"{out['when']}; {out['model']}; OPENBLAS_CORETYPE {out['coretype']}; {a.rounds} alternating rounds of "
        f"{a.steps} steps each side (the first {a.warmup} not timed); per run the median step period.", "",
        "| | ms/step per round | median |", "|---|---|---|",
        f"| snapshot_every 1 | {', '.join(f'{x:.1f}' for x in out['ms_with'])} | {statistics.median(out['ms_with']):.1f} |",
        f"| snapshot_every 0 | {', '.join(f'{x:.1f}' for x in out['ms_without'])} | "
        f"{statistics.median(out['ms_without']):.1f} |", "",
        f"Step-time ratio (with / without, paired by round): **{out['ratio_median']:.3f}** "
        f"(min {out['ratio_min']:.3f}, max {out['ratio_max']:.3f}); target <= 1.05.", "",
        "Each snapshot copies and sends, per rank: " +
        ", ".join(f"rank {r}: {b / 2**20:.1f} MiB" for r, b in enumerate(bytes_per_rank or [])) +
        " (parameters + AdamW m and v of its stages), every step.",
    ]
    os.makedirs(os.path.join(HERE, "results", "snapshot"), exist_ok=True)
    stem = os.path.join(HERE, "results", "snapshot", a.model + ("-native" if a.native else ""))
    with open(stem + ".json", "w") as f:
        json.dump(out, f, indent=1)
    with open(stem + ".md", "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()

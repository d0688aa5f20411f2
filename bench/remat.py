#!/usr/bin/env python3
"""remat: what activation recomputation (partition.remat, issue 18) saves in
memory and costs in step time.

The d256 bench GPT (bench/jobs/gpt-d256.json) with 8 layers as a pp = 2
pipeline of two 1-thread workers (1f1b unless --schedule, 8 microbatches),
run with partition.remat "full" and "none" in alternating rounds (A B, B A,
...) on fresh workers. Per run: the median wall time between consecutive
steps after the warm-up, and each worker's peak RSS (VmHWM from
/proc/PID/status, read at its last step report). Reported: the median of
the per-round step-time ratios (remat / none) and their min-max; per rank
the measured peak RSS both ways against the planner's memory_bytes both
ways: the measured drop over the predicted drop (within 10 %?), and RSS over
the prediction (the process baseline — code, libraries, OpenBLAS buffers,
frame buffers — is outside the plan).

  bench/remat.py [--build DIR] [--schedule 1f1b] [--rounds 3] [--steps 12] [--warmup 2]

Writes bench/results/remat/<schedule>.{json,md} and prints the markdown."""
import argparse, atexit, json, os, shutil, statistics, sys, tempfile, time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import pipe  # noqa: E402


def job(remat, sched, steps):
    j = json.load(open(os.path.join(HERE, "jobs", "gpt-d256.json")))
    j["name"] = f"remat-{remat}"
    j["model"]["n_layers"] = 8
    j["mesh"] = {"pp": 2, "dp": 1, "virtual_stages": 2 if sched.startswith(("interleaved", "kimi", "dual")) else 1}
    j["schedule"] = {"name": sched, "microbatches": 8}
    j["partition"] = {"mode": "even", "remat": remat}
    j["train"].update(steps=steps, checkpoint_every=0)
    j["data"]["path"] = os.path.join(ROOT, j["data"]["path"])
    return j


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--schedule", default="1f1b")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2)
    a = ap.parse_args()
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    scratch = tempfile.mkdtemp(prefix="pw-remat-")
    atexit.register(shutil.rmtree, scratch, True)  # ranks' state and checkpoints: gigabytes
    kinds = ("full", "none")
    period = {k: [] for k in kinds}
    hwm = {k: [] for k in kinds}     # per run: [rank0, rank1]
    plan, makespan = {}, {}
    for rnd in range(a.rounds):
        for k in kinds if rnd % 2 == 0 else kinds[::-1]:
            res = pipe.run(a.build, job(k, a.schedule, a.steps), os.path.join(scratch, f"r{rnd}-{k}"),
                           trace_every=0, env=env)
            period[k].append(pipe.step_period(res, a.warmup))
            hwm[k].append([res["reports"][r][-1]["hwm"] for r in range(2)])
            plan[k] = [r["memory_bytes"] for r in res["plan"]["analytics"]["ranks"]]
            makespan[k] = res["plan"]["analytics"]["makespan"]
            print(f"round {rnd}: remat {k}: {period[k][-1] * 1e3:.1f} ms/step, peak RSS "
                  f"{[round(x / 2**20, 1) for x in hwm[k][-1]]} MiB", file=sys.stderr, flush=True)
    ratios = [f / n for f, n in zip(period["full"], period["none"])]
    MiB = 2**20
    ranks = []
    for r in range(2):
        meas = {k: statistics.median(x[r] for x in hwm[k]) for k in kinds}
        drop_m, drop_p = meas["none"] - meas["full"], plan["none"][r] - plan["full"][r]
        ranks.append({"rank": r, "rss_none": meas["none"], "rss_full": meas["full"], "plan_none": plan["none"][r],
                      "plan_full": plan["full"][r], "drop_measured": drop_m, "drop_planned": drop_p,
                      "drop_ratio": drop_m / drop_p if drop_p else None,
                      "within_10pct": bool(drop_p) and abs(drop_m / drop_p - 1) <= 0.10})
    out = {"when": time.strftime("%Y-%m-%d %H:%M:%S"),
           "model": f"gpt d256, 8 layers, seq 128, batch 16 as pp = 2 ({a.schedule}, m = 8), two 1-thread workers",
           "rounds": a.rounds, "steps": a.steps, "warmup": a.warmup,
           "ms_full": [x * 1e3 for x in period["full"]], "ms_none": [x * 1e3 for x in period["none"]],
           "ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
           "ratio_simulated": makespan["full"] / makespan["none"], "load_1min": os.getloadavg()[0], "ranks": ranks}
    md = ["# Activation recomputation (issue 18)", "",
          f"{out['when']}; {out['model']}; {a.rounds} alternating rounds of {a.steps} steps each side (the first "
          f"{a.warmup} not timed); per run the median step period; peak RSS = VmHWM, median over the rounds.", "",
          "| | ms/step per round | median |", "|---|---|---|",
          f"| remat full | {', '.join(f'{x:.1f}' for x in out['ms_full'])} | {statistics.median(out['ms_full']):.1f} |",
          f"| remat none | {', '.join(f'{x:.1f}' for x in out['ms_none'])} | {statistics.median(out['ms_none']):.1f} |",
          "", f"Step-time ratio (full / none, paired by round): **{out['ratio_median']:.3f}** "
          f"(min {out['ratio_min']:.3f}, max {out['ratio_max']:.3f}); the simulator's (makespan with the F added to "
          f"each B, FLOP costs): {out['ratio_simulated']:.3f}. Load average at the end: {out['load_1min']:.1f} on "
          f"{os.cpu_count()} CPUs.", "",
          "| rank | peak RSS none | peak RSS full | planned none | planned full | measured drop | planned drop | "
          "drop ratio | within 10 % |", "|---|---|---|---|---|---|---|---|---|"]
    for x in ranks:
        md.append(f"| {x['rank']} | {x['rss_none'] / MiB:.1f} MiB | {x['rss_full'] / MiB:.1f} MiB | "
                  f"{x['plan_none'] / MiB:.1f} MiB | {x['plan_full'] / MiB:.1f} MiB | {x['drop_measured'] / MiB:.1f} MiB | "
                  f"{x['drop_planned'] / MiB:.1f} MiB | {x['drop_ratio']:.3f} | {'yes' if x['within_10pct'] else 'no'} |")
    md.append("")
    md.append("Planned = the plan's memory_bytes (pw_plan_mem.total): the process baseline is outside it, so the "
              "absolute RSS sits above it by about the same amount both ways; the drop is what remat saves.")
    text = "\n".join(md) + "\n"
    os.makedirs(os.path.join(HERE, "results", "remat"), exist_ok=True)
    base = os.path.join(HERE, "results", "remat", a.schedule)
    json.dump(out, open(base + ".json", "w"), indent=1)
    open(base + ".md", "w").write(text)
    print(text)


if __name__ == "__main__":
    main()

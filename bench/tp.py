#!/usr/bin/env python3
"""tp: a stage split over two tensor-parallel workers against one worker
(issue 17), on this machine's cores.

The d512 bench GPT (bench/jobs/gpt-d512.json: 8 layers, seq 256, batch 8,
one microbatch) as one stage, three ways in alternating rounds on fresh
workers: tp = 2 (two 1-thread workers, one core each), tp = 1 on one
1-thread worker, tp = 1 on one 2-thread worker (OpenBLAS splits each
matmul: the same two cores). Per run: the median wall time between
consecutive steps after the warm-up; for tp = 2 also where a step's time
goes — the F and B actions as traced, of which the time inside the
all-reduces (tp_seconds of the step reports: sending, waiting for the
peer, adding), and the bytes each worker sent (tp_bytes, against the
plan's tp_bytes_per_step).

  bench/tp.py [--build DIR] [--rounds 3] [--steps 8] [--warmup 2]

Writes bench/results/tp/d512.{json,md} and prints the markdown. Indicative:
the machine is shared."""
import argparse, atexit, json, os, shutil, statistics, sys, tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import pipe  # noqa: E402

KINDS = ("tp2", "tp1-1thread", "tp1-2threads")


def job(kind, steps):
    j = json.load(open(os.path.join(HERE, "jobs", "gpt-d512.json")))
    j["name"] = f"tp-{kind}"
    j["mesh"]["tp"] = 2 if kind == "tp2" else 1
    j["train"].update(steps=steps, checkpoint_every=0, snapshot_every=0)
    j["data"]["path"] = os.path.join(ROOT, j["data"]["path"])
    return j


def median(xs):
    return statistics.median(xs) if xs else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    a = ap.parse_args()
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    scratch = tempfile.mkdtemp(prefix="pw-tp-bench-")
    atexit.register(shutil.rmtree, scratch, True)  # ranks' state and checkpoints: gigabytes
    period = {k: [] for k in KINDS}
    split = {"F": [], "B": [], "allreduce": [], "step": []}
    sent, planned = set(), None
    for rnd in range(a.rounds):
        order = KINDS if rnd % 2 == 0 else KINDS[::-1]
        for k in order:
            args = ("--threads", "2") if k == "tp1-2threads" else ()
            res = pipe.run(a.build, job(k, a.steps), os.path.join(scratch, f"r{rnd}-{k}"), trace_every=1, env=env,
                           worker_args=args)
            period[k].append(pipe.step_period(res, a.warmup))
            if k != "tp2":
                continue
            planned = res["plan"]["analytics"]["ranks"][0]["tp_bytes_per_step"]
            for rep in res["reports"]:
                for m in rep:
                    if m["step"] < a.warmup:
                        continue
                    sent.add(m.get("tp_bytes"))
                    split["allreduce"].append(m.get("tp_seconds", 0.0))
                    split["step"].append(m["step_time"])
                    for kind in ("F", "B"):
                        split[kind].append(sum(t1 - t0 for kd, _, _, t0, t1 in m.get("actions", []) if kd == kind))
    med = {k: median(v) for k, v in period.items()}
    ratio = lambda x, y: [p / q for p, q in zip(period[x], period[y])]  # noqa: E731
    out = {"job": "bench/jobs/gpt-d512.json", "rounds": a.rounds, "steps": a.steps, "warmup": a.warmup,
           "step_seconds": period, "median": med,
           "tp2_over_tp1_1thread": ratio("tp2", "tp1-1thread"), "tp2_over_tp1_2threads": ratio("tp2", "tp1-2threads"),
           "tp2_split_median": {k: median(v) for k, v in split.items()},
           "tp2_bytes_sent_per_step": sorted(x for x in sent if x is not None), "planned_bytes_per_step": planned,
           "cores": os.cpu_count(), "load": os.getloadavg()}
    os.makedirs(os.path.join(HERE, "results", "tp"), exist_ok=True)
    json.dump(out, open(os.path.join(HERE, "results", "tp", "d512.json"), "w"), indent=1)
    sp = out["tp2_split_median"]
    r1, r2 = out["tp2_over_tp1_1thread"], out["tp2_over_tp1_2threads"]
    md = [f"# tp = 2 vs tp = 1, d512 (bench/tp.py; {a.rounds} rounds x {a.steps} steps, {os.cpu_count()} cores, "
          f"load {out['load'][0]:.1f} at the end: indicative)", "",
          "| run | median step (s) |", "|---|---|"]
    md += [f"| {k} | {med[k]:.3f} |" for k in KINDS]
    md += ["", f"tp2 / tp1 (1 thread): median {median(r1):.2f} (min {min(r1):.2f}, max {max(r1):.2f}); "
           f"tp2 / tp1 (2 threads): median {median(r2):.2f} (min {min(r2):.2f}, max {max(r2):.2f}).", "",
           f"Where a tp = 2 step goes (median per worker): step {sp['step']:.3f} s, F actions {sp['F']:.3f} s, "
           f"B actions {sp['B']:.3f} s, of which inside the all-reduces {sp['allreduce']:.3f} s "
           f"({100 * sp['allreduce'] / sp['step']:.0f} % of the step); the rest of the step is the update and "
           f"step end. Bytes sent per worker per step: {out['tp2_bytes_sent_per_step']} (plan: {planned})."]
    text = "\n".join(md) + "\n"
    open(os.path.join(HERE, "results", "tp", "d512.md"), "w").write(text)
    print(text)


if __name__ == "__main__":
    main()

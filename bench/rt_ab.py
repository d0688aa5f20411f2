"""rt_ab: two builds of the worker runtime side by side (issue 16 part 5: the idle wait, snapshots off
the critical path), interleaved A B / B A in every round:

    /usr/bin/python3 bench/rt_ab.py --base OLD_BUILD --new NEW_BUILD [--rounds 5] [--name ab]

Each round, per build: the wake-up of a process blocked 1 ms (`bench_transport wakeidle`), then
  - tiny pp = 2: case 4's job (GPT 2 layers, d=64, T=64, batch 2, m = 1, 1f1b), 300 steps: the
    ranks' worker step time (median of steps 20..298, the slower rank's) and the step period;
  - d128 pp = 2 and pp = 4 (four ranks sharing 2 cores): case 3's job (GPT d=128, 8 layers, T=64,
    B=16, m = 8, 1f1b), 14 steps, the period after 2 warm-up steps;
  - d256 pp = 2: bench/jobs/gpt-d256.json (4 layers, T=64, B=16, m = 8, 1f1b), 12 steps, the same.
Writes bench/results/runtime/NAME.{json,md}: per build the medians with the rounds' range, and the median of the
paired ratios base ÷ new (> 1: the new build is faster), with the other processes' CPU share
(costmodel.py's OtherCpu): above 5 % the figures are indicative."""
import argparse, json, os, shutil, statistics, subprocess, tempfile

import cases_rt
import pipe
from costmodel import OtherCpu

HERE = os.path.dirname(os.path.abspath(__file__))
CASES = {  # name: (job args for cases_rt._job, warm-up steps)
    "tiny pp = 2": ((64, 2, 4, 64, 2, 1, 2, 1, "1f1b", 300), 20),
    "d128 pp = 2": ((128, 8, 4, 64, 16, 8, 2, 1, "1f1b", 14), 2),
    "d128 pp = 4": ((128, 8, 4, 64, 16, 8, 4, 1, "1f1b", 14), 2),
    "d256 pp = 2": ((256, 4, 4, 64, 16, 8, 2, 1, "1f1b", 12), 2),
}


def wake(build):
    r = subprocess.run([os.path.join(build, "bench", "bench_transport"), "wakeidle", "300"], capture_output=True,
                       text=True, check=True)
    return json.loads(r.stdout)["us_per_wakeup"]


def one(build, case, scratch, env):
    args, warm = CASES[case]
    job = cases_rt._job(*args)
    out = os.path.join(scratch, "run")
    res = pipe.run(build, job, out, trace_every=0, env=env)
    shutil.rmtree(out, ignore_errors=True)
    steps = job["train"]["steps"]
    st = statistics.median([max(rep[k]["step_time"] for rep in res["reports"]) for k in range(warm, steps - 1)])
    return {"step_us": st * 1e6, "period_us": pipe.step_period(res, warm) * 1e6}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", required=True)
    ap.add_argument("--new", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--name", default="ab")
    a = ap.parse_args()
    builds = {"base": os.path.abspath(a.base), "new": os.path.abspath(a.new)}
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    scratch = tempfile.mkdtemp(prefix="pw-rt-ab-")
    other = OtherCpu()
    got = {(b, c): [] for b in builds for c in CASES}
    wakes = {b: [] for b in builds}
    try:
        for rd in range(a.rounds):
            for b in (("base", "new") if rd % 2 == 0 else ("new", "base")):
                wakes[b].append(wake(builds[b]))
                for c in CASES:
                    got[(b, c)].append(one(builds[b], c, scratch, env))
                    print(f"round {rd + 1} {b} {c}: {got[(b, c)][-1]}", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    share = other.share()
    med = statistics.median
    rows = []
    for c in CASES:
        row = {"case": c}
        for key in ("step_us", "period_us"):
            for b in builds:
                v = [x[key] for x in got[(b, c)]]
                row[f"{b}_{key}"], row[f"{b}_{key}_rounds"] = med(v), v
            ratio = [x[key] / y[key] for x, y in zip(got[("base", c)], got[("new", c)])]
            row[f"ratio_{key}"], row[f"ratio_{key}_rounds"] = med(ratio), ratio
        rows.append(row)
    res = {"rounds": a.rounds, "other_cpu": share, "wake_us": wakes, "rows": rows, "builds": builds}
    L = [f"# Runtime A/B: base vs new build ({a.rounds} rounds, interleaved)\n",
         f"Other processes used {100 * share:.0f} % of the CPUs while this ran"
         + (": **indicative** figures.\n" if share > 0.05 else ".\n"),
         "Wake-up of a process blocked 1 ms (µs, per round): base "
         + " ".join(f"{w:.1f}" for w in wakes["base"]) + "; new " + " ".join(f"{w:.1f}" for w in wakes["new"]) + "\n",
         "| case | base step µs | new step µs | base ÷ new (rounds' range) | base period µs | new period µs "
         "| base ÷ new (rounds' range) |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        def rr(key):
            v = r[f"ratio_{key}_rounds"]
            return f"{r[f'ratio_{key}']:.2f} ({min(v):.2f}–{max(v):.2f})"
        L.append(f"| {r['case']} | {r['base_step_us']:.0f} | {r['new_step_us']:.0f} | {rr('step_us')} "
                 f"| {r['base_period_us']:.0f} | {r['new_period_us']:.0f} | {rr('period_us')} |")
    md = "\n".join(L) + "\n"
    os.makedirs(os.path.join(HERE, "results", "runtime"), exist_ok=True)
    out = os.path.join(HERE, "results", "runtime", a.name)
    with open(out + ".json", "w") as f:
        json.dump(res, f, indent=1)
    with open(out + ".md", "w") as f:
        f.write(md)
    print(md)


if __name__ == "__main__":
    main()

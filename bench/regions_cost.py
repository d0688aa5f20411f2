#!/usr/bin/env python3
"""regions_cost: a regions job's step, predicted by the calibrated cost model
against measured, with its regions concurrent (each on ranks of its own) and
serial (one after another on the widest region's ranks, what SpectraX does):
issue 19's "close to the simulator's prediction".

The job: examples/jobs/two-tower.json (text 1f1b pp 2, vision zb-h1 pp 2,
head pp 1: 5 ranks concurrent, 2 serial). `pipewright calibrate` once, then
`plan --compare-regions --profile --json`: each execution's makespan with
every rank on this host's cores (the profile's measured sharing) plus the
slowest rank's step end. Measured: bench/pipe.py on fresh one-thread
workers, the median step period after the warm-up, in interleaved rounds.

  bench/regions_cost.py [--build DIR] [--job FILE] [--rounds 5] [--steps 30] [--warmup 2] [--out NAME]

Writes bench/results/NAME.{json,md} (default regions-cost) and prints the markdown."""
import argparse, json, os, statistics, subprocess, sys, tempfile, time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import pipe  # noqa: E402
from costmodel import OtherCpu, bench_args, pw, quiet_note, write  # noqa: E402


def variant(base, serial, steps):
    j = json.loads(json.dumps(base))
    j["train"].update(steps=steps, checkpoint_every=0)
    j["train"].pop("eval_batches", None)
    if serial:
        j["schedule"]["regions"] = "serial"
        j["mesh"]["pp"] = max(r.get("mesh", {}).get("pp", 1) for r in j["model"]["regions"])
    j["name"] = base["name"] + ("-serial" if serial else "-concurrent")
    return j


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--job", default=os.path.join(ROOT, "examples", "jobs", "two-tower.json"))
    bench_args(ap, "regions-cost", 5, 30)
    a = ap.parse_args()
    watch = OtherCpu()
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    scratch = tempfile.mkdtemp(prefix="pw-regions-cost-")
    base = json.load(open(a.job))
    m = base["schedule"]["microbatches"]
    mb = base["train"]["batch_size"] // m
    spec = write(os.path.join(scratch, "job.json"), variant(base, False, a.steps))
    prof = os.path.join(scratch, "profile.json")
    # its layers take a millisecond or less: 100 ms of repeats per layer and size steady the medians
    pw(a.build, "calibrate", "--job", spec, "--mb", ",".join(str(x) for x in sorted({1, mb, 2 * mb})), "--target-ms",
       "100", "--out", prof)
    cmp = json.loads(pw(a.build, "plan", "--job", spec, "--profile", prof, "--compare-regions", "--json"))
    pred = cmp["predicted"]
    kinds = ["concurrent", "serial"]
    meas = {k: [] for k in kinds}
    for rnd in range(a.rounds):
        for k in kinds if rnd % 2 == 0 else kinds[::-1]:
            res = pipe.run(a.build, variant(base, k == "serial", a.steps), os.path.join(scratch, f"r{rnd}-{k}"),
                           trace_every=0, env=env)
            meas[k].append(pipe.step_period(res, a.warmup))
            print(f"round {rnd}: {k}: {meas[k][-1] * 1e3:.2f} ms/step (predicted {pred[k] * 1e3:.2f})",
                  file=sys.stderr, flush=True)
    rows = []
    for k in kinds:
        mm = statistics.median(meas[k])
        rows.append({"execution": k, "ranks": cmp[k]["ranks"], "predicted_ms": pred[k] * 1e3, "measured_ms": mm * 1e3,
                     "rounds_ms": [x * 1e3 for x in meas[k]], "error": pred[k] / mm - 1,
                     "within_10pct": abs(pred[k] / mm - 1) <= 0.10})
    ratio_meas = rows[1]["measured_ms"] / rows[0]["measured_ms"]
    other = watch.share()
    out = {"when": time.strftime("%Y-%m-%d %H:%M:%S"), "job": os.path.relpath(a.job, ROOT), "rounds": a.rounds,
           "steps": a.steps, "warmup": a.warmup, "other_cpu": other, "cpus": os.cpu_count(),
           "cores_in_profile": cmp["cores"]["cores"], "rows": rows, "ratio_predicted": pred["speedup"],
           "ratio_measured": ratio_meas}
    md = ["# Regions: predicted vs measured step, concurrent and serial (issue 19)", "",
          f"{out['when']}; {out['job']} ({m} microbatches of {mb}), one-thread workers on this host "
          f"({os.cpu_count()} CPUs, shared by every rank), {a.rounds} interleaved rounds of {a.steps} steps (the "
          f"first {a.warmup} not timed). Predicted: `pipewright plan --compare-regions --profile` after "
          "`pipewright calibrate` (the makespan with the ranks sharing the host's cores at the profile's measured "
          f"speeds, plus the step end); measured: bench/pipe.py, the median step period. " + quiet_note(other), "",
          "| execution | ranks | predicted ms | measured ms | per round | error | within 10 % |",
          "|---|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['execution']} | {r['ranks']} | {r['predicted_ms']:.2f} | {r['measured_ms']:.2f} | "
                  f"{', '.join(f'{x:.2f}' for x in r['rounds_ms'])} | {100 * r['error']:+.1f} % | "
                  f"{'yes' if r['within_10pct'] else 'no'} |")
    md += ["", f"Serial / concurrent step: predicted {pred['speedup']:.2f}, measured {ratio_meas:.2f}."]
    text = "\n".join(md) + "\n"
    base_out = os.path.join(HERE, "results", a.out)
    os.makedirs(os.path.dirname(base_out), exist_ok=True)
    write(base_out + ".json", out)
    open(base_out + ".md", "w").write(text)
    print(text)


if __name__ == "__main__":
    main()

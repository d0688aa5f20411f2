#!/usr/bin/env python3
"""costmodel: the calibrated cost model (common/plan/cost.h, issue 16 part 3)
against measured steps.

Per round and bench model (bench/jobs/gpt-d*.json): `pipewright calibrate`
(the microbatch sizes the grid needs), then for every pp x m of the grid
(schedule 1f1b, even partition, one-thread workers on this host) the
planner's predicted step (`plan --profile --json`: the makespan, with the
ranks sharing this host's cores, plus the step end) against the measured
one (bench/pipe.py: fresh workers, the median period between steps after
the warm-up), in interleaved rounds (each round runs every cell once, in
reversed order every other round). Then `plan --auto` over the same models:
its choice is run too and compared with the fastest cell measured.

  bench/costmodel.py [--build DIR] [--models d256,d512] [--pp 1,2,4] [--m 2,4,8,16]
                     [--rounds 2] [--steps 8] [--warmup 2] [--out NAME]

Writes bench/results/costmodel/NAME.{json,md} (default grid) and prints the markdown."""
import argparse, atexit, json, os, shutil, statistics, subprocess, sys, tempfile, time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import pipe  # noqa: E402


MIN_BATCH = 1  # raised to the grid's largest m: every cell splits the same batch


def job(model, pp, m, steps, sched="1f1b", V=1):
    j = json.load(open(os.path.join(HERE, "jobs", f"gpt-{model}.json")))
    j["train"]["batch_size"] = max(j["train"]["batch_size"], MIN_BATCH)
    j["name"] = f"cost-{model}-pp{pp}-m{m}"
    j["mesh"] = {"pp": pp, "dp": 1, "virtual_stages": V}
    j["schedule"] = {"name": sched, "microbatches": m}
    j["train"].update(steps=steps, checkpoint_every=0)
    j["data"]["path"] = os.path.join(ROOT, j["data"]["path"])
    return j


class OtherCpu:
    """The share of the host's CPUs that processes other than this one and its reaped children (the
    ranks, calibrate, plan) used since it was made: the load average counts the benchmark's own ranks."""

    def __init__(self):
        self.t0 = self.busy(), self.ours(), time.monotonic()

    @staticmethod
    def busy():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:9]]
        return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")  # all but idle and iowait

    @staticmethod
    def ours():
        t = os.times()
        return t.user + t.system + t.children_user + t.children_system

    def share(self):
        b0, o0, w0 = self.t0
        return max(0.0, (self.busy() - b0) - (self.ours() - o0)) / ((time.monotonic() - w0) * os.cpu_count())


def quiet_note(other, why="The prediction assumes the host's cores free for the job's ranks and the calibration "
                           "ran slowed too; the per-round spread shows how much that moved each cell."):
    """The results' sentence on what else ran: indicative above 5 % of the CPUs (why: what that does)."""
    line = f"Other processes used {100 * other:.1f} % of the {os.cpu_count()} CPUs while this ran."
    if other <= 0.05:
        return line
    return f"**Indicative**: {line} {why}"


def write(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=1)
    return path


def pw(build, *args):
    return subprocess.run([os.path.join(build, "pipewright"), *args], check=True, capture_output=True,
                          text=True, env=dict(os.environ, OPENBLAS_NUM_THREADS="1")).stdout


def bench_args(ap, out, rounds, steps):
    """The options every predicted-vs-measured script takes."""
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--out", default=out)


def grid(build, models, pps, ms, rounds, steps, warmup):
    """Each round, per model: `pipewright calibrate`, then every cell (and --auto's choice, taken from the
    first round's calibration) predicted from that calibration and measured right after it, so that
    the host's speed, which drifts by several % over minutes on a VM, is the same for both; returns the
    result object (rows with per-round predictions, measurements and errors, auto, what else ran)."""
    watch = OtherCpu()
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    scratch = tempfile.mkdtemp(prefix="pw-cost-")
    atexit.register(shutil.rmtree, scratch, True)  # ranks' state and checkpoints: gigabytes
    global MIN_BATCH
    MIN_BATCH = max(ms)
    cells = {model: [(model, pp, m, "1f1b", 1) for pp in pps for m in ms] for model in models}
    pred, meas, auto = {}, {}, {}
    for rnd in range(rounds):
        for model in models if rnd % 2 == 0 else models[::-1]:
            batch = job(model, 1, 1, 1)["train"]["batch_size"]
            sizes = sorted({batch // m for m in ms} | {1})
            spec = write(os.path.join(scratch, f"{model}.json"), job(model, 1, 1, steps))
            prof = os.path.join(scratch, f"{model}-profile-r{rnd}.json")
            pw(build, "calibrate", "--job", spec, "--mb", ",".join(map(str, sizes)), "--out", prof)
            if model not in auto:  # --auto's choice, run alongside the grid
                ch = json.loads(pw(build, "plan", "--job", spec, "--profile", prof, "--auto", "--max-pp",
                                   str(max(pps)), "--json"))["chosen"]
                auto[model] = (model, ch["pp"], ch["microbatches"], ch["schedule"], ch["virtual_stages"])
                if auto[model] not in cells[model]:
                    cells[model].append(auto[model])
            for c in cells[model] if rnd % 2 == 0 else cells[model][::-1]:
                _, pp, m, sched, V = c
                j = job(model, pp, m, steps, sched, V)
                spec = write(os.path.join(scratch, "pred.json"), j)
                p = json.loads(pw(build, "plan", "--job", spec, "--profile", prof, "--json"))["predicted_step"]
                res = pipe.run(build, j, os.path.join(scratch, f"r{rnd}-{model}-{pp}-{m}-{sched}"), trace_every=0,
                               env=env)
                pred.setdefault(c, []).append(p["seconds"])
                meas.setdefault(c, []).append(pipe.step_period(res, warmup))
                shutil.rmtree(os.path.join(scratch, f"r{rnd}-{model}-{pp}-{m}-{sched}"), True)
                print(f"round {rnd}: {model} pp {pp} m {m} {sched}: {meas[c][-1] * 1e3:.1f} ms/step "
                      f"(predicted {pred[c][-1] * 1e3:.1f})", file=sys.stderr, flush=True)
    shutil.rmtree(scratch, True)
    rows = []
    for model in models:
        for c in cells[model]:
            _, pp, m, sched, V = c
            err = statistics.median(p / x - 1 for p, x in zip(pred[c], meas[c]))
            rows.append({"model": model, "pp": pp, "m": m, "schedule": sched, "virtual_stages": V,
                         "predicted_ms": statistics.median(pred[c]) * 1e3,
                         "measured_ms": statistics.median(meas[c]) * 1e3,
                         "rounds_ms": [x * 1e3 for x in meas[c]], "rounds_predicted_ms": [x * 1e3 for x in pred[c]],
                         "error": err, "within_10pct": abs(err) <= 0.10, "auto": c == auto[model]})
    choice = []
    for model in models:
        mine = [r for r in rows if r["model"] == model]
        best = min(mine, key=lambda r: r["measured_ms"])
        ch = next(r for r in mine if r["auto"])
        choice.append({"model": model, "auto": ch, "fastest": best,
                       "within_5pct": ch["measured_ms"] <= 1.05 * best["measured_ms"]})
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or "unknown"
    return {"when": time.strftime("%Y-%m-%d %H:%M:%S"), "commit": commit, "rounds": rounds, "steps": steps,
            "warmup": warmup, "other_cpu": watch.share(), "cpus": os.cpu_count(), "models": models,
            "min_batch": MIN_BATCH, "per_round_calibration": True, "rows": rows, "auto": choice}


def md_lines(out):
    """The result object as markdown lines: how it was measured, the table, --auto's choice."""
    md = [f"{out['when']}, pipewright {out.get('commit', '?')}; bench models {', '.join(out.get('models', []))} "
          f"(bench/jobs; batch raised to {out.get('min_batch', '?')} where smaller, so every m splits it), schedule "
          f"1f1b unless marked, one-thread workers on this host ({out['cpus']} CPUs: pp 4 shares them), "
          f"{out['rounds']} interleaved rounds of {out['steps']} steps (the first {out['warmup']} not timed). "
          "Predicted: `pipewright plan --profile` (the makespan with ranks sharing the host's cores, plus the step "
          "end) after `pipewright calibrate`" + (", calibrated again in each round right before that model's cells "
          "(this VM's speed drifts by several % over minutes: calibration and runs then see the same host)"
          if out.get("per_round_calibration") else "") + "; measured: bench/pipe.py, the median step period "
          "between steps. Error: the median over the rounds of predicted ÷ measured − 1. "
          + quiet_note(out["other_cpu"]), "",
          "| model | pp | m | schedule | predicted ms | measured ms | per round: measured (predicted) | error "
          "| within 10 % |",
          "|---|---|---|---|---|---|---|---|---|"]
    for r in out["rows"]:
        pr = r.get("rounds_predicted_ms") or [None] * len(r["rounds_ms"])
        per = ", ".join(f"{x:.1f}" + (f" ({q:.1f})" if q else "") for x, q in zip(r["rounds_ms"], pr))
        md.append(f"| {r['model']} | {r['pp']} | {r['m']} | {r['schedule']}{' (auto)' if r['auto'] else ''} | "
                  f"{r['predicted_ms']:.1f} | {r['measured_ms']:.1f} | {per} | {100 * r['error']:+.1f} % | "
                  f"{'yes' if r['within_10pct'] else 'no'} |")
    ok = sum(r["within_10pct"] for r in out["rows"])
    md += ["", f"{ok} of {len(out['rows'])} cells within 10 %."]
    md += ["", "| model | --auto chose | its measured ms | fastest measured | its ms | auto within 5 % |",
           "|---|---|---|---|---|---|"]
    for c in out["auto"]:
        x, b = c["auto"], c["fastest"]
        md.append(f"| {c['model']} | pp {x['pp']} {x['schedule']} V {x['virtual_stages']} m {x['m']} | "
                  f"{x['measured_ms']:.1f} | pp {b['pp']} {b['schedule']} m {b['m']} | {b['measured_ms']:.1f} | "
                  f"{'yes' if c['within_5pct'] else 'no'} |")
    return md


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="d256")
    ap.add_argument("--pp", default="1,2,4")
    ap.add_argument("--m", default="2,4,8,16")
    bench_args(ap, "grid", 2, 8)
    a = ap.parse_args()
    out = grid(a.build, a.models.split(","), [int(x) for x in a.pp.split(",")], [int(x) for x in a.m.split(",")],
               a.rounds, a.steps, a.warmup)
    md = ["# Calibrated cost model: predicted vs measured step (issue 16 part 3)", ""] + md_lines(out)
    md += ["", "The full grid (pp 1, 2, 4 x m 2, 4, 8, 16 x d256, d512, d768) on a quiet machine: "
           "`bench/costmodel.py --models d256,d512,d768 --rounds 3 --steps 5` (about 70 min on 2 cores), "
           "or case 8 of `bench/run.sh`."]
    text = "\n".join(md) + "\n"
    os.makedirs(os.path.join(HERE, "results", "costmodel"), exist_ok=True)
    base = os.path.join(HERE, "results", "costmodel", a.out)
    write(base + ".json", out)
    open(base + ".md", "w").write(text)
    print(text)


if __name__ == "__main__":
    main()

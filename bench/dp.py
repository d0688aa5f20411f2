#!/usr/bin/env python3
"""dp: the data-parallel gradient exchange of real workers against the
raw-socket bound (issue 17: "dp all-reduce time vs the raw-socket bound").

Per cell (bench model d256 or d512 from bench/jobs, dp 2 or 3 at pp 1,
train.zero 0, one microbatch of 2 sequences per replica, 1-thread
workers on fresh processes): the exchange time per step that the step
reports carry (dp_seconds: from the start of the rank's reduce-scatter to
its all-gather's last chunk, waiting for slower replicas included; per
step the smallest over the ranks, the replica that came last and so waited
least, and the largest) and the bytes each rank sent (dp_bytes). The bound:
bench_coll (bench/bench_coll.c) moving the same floats in the same pattern
(direct reduce-scatter, sums in replica order a chunk at a time, each
summed chunk sent on as it is done) between K processes over loopback TCP,
busy-polled, with nothing else to do — N floats from the reports, whose
dp_bytes add up to 2 (K-1) N floats per step. Rounds interleave the two
(in reversed order every other round); figures are medians over rounds and
steps after the warm-up, with min-max.

  bench/dp.py [--build DIR] [--rounds 3] [--steps 6] [--warmup 2] [--raw-rounds 10]
              [--models d256,d512] [--dp 2,3] [--out dp-allreduce]

Writes bench/results/dp/OUT.{json,md} (default allreduce) and prints the markdown. The other
processes' CPU share while it ran is recorded (costmodel.OtherCpu): above
5 % the figures are indicative."""
import argparse, json, os, shutil, statistics, subprocess, sys, tempfile, time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import pipe  # noqa: E402
from costmodel import OtherCpu, bench_args, quiet_note  # noqa: E402


def job(model, dp, steps):
    j = json.load(open(os.path.join(HERE, "jobs", f"gpt-{model}.json")))
    j["name"] = f"dp-{model}-dp{dp}"
    j["mesh"] = {"pp": 1, "dp": dp, "virtual_stages": 1}
    j["schedule"] = {"name": "1f1b", "microbatches": 1}
    j["train"].update(steps=steps, batch_size=2 * dp, checkpoint_every=0, snapshot_every=0, zero=0)
    j["data"]["path"] = os.path.join(ROOT, j["data"]["path"])
    return j


WHY = ("Both sides lose cores to them and the medians move most; the min columns (the least disturbed samples) "
       "say more then.")


def spread(xs):
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)} if xs else None


def raw(build, k, n, rounds):
    out = subprocess.run([os.path.join(build, "bench", "bench_coll"), str(k), str(n), str(rounds)], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


def main():
    ap = argparse.ArgumentParser()
    bench_args(ap, "allreduce", 3, 6)
    ap.add_argument("--raw-rounds", type=int, default=10)
    ap.add_argument("--models", default="d256,d512")
    ap.add_argument("--dp", default="2,3")
    a = ap.parse_args()
    watch = OtherCpu()
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    scratch = tempfile.mkdtemp(prefix="pw-dp-bench-")
    cells = [(m, int(k)) for m in a.models.split(",") for k in a.dp.split(",")]
    got = {c: {"least": [], "most": [], "raw": [], "n": set(), "bytes": set(), "planned": None} for c in cells}
    for rnd in range(a.rounds):
        for c in cells if rnd % 2 == 0 else cells[::-1]:
            model, k = c
            g = got[c]
            order = ("pw", "raw") if rnd % 2 == 0 else ("raw", "pw")
            for side in order:
                if side == "raw":  # the first round's raw run needs the floats from its pw run: after it
                    if g["n"]:
                        g["raw"] += raw(a.build, k, max(g["n"]), a.raw_rounds)["seconds"]
                    continue
                out = os.path.join(scratch, f"r{rnd}-{model}-{k}")
                res = pipe.run(a.build, job(model, k, a.steps), out, trace_every=0, env=env)
                shutil.rmtree(out, ignore_errors=True)  # its checkpoints: hundreds of MB per run
                g["planned"] = res["plan"]["analytics"]["ranks"][0].get("dp_bytes_per_step")
                for s in range(a.warmup, a.steps):
                    reps = [m for rep in res["reports"] for m in rep if m["step"] == s]
                    secs = [m["dp_seconds"] for m in reps]
                    sent = [m["dp_bytes"] for m in reps]
                    g["least"].append(min(secs))
                    g["most"].append(max(secs))
                    g["bytes"].update(sent)
                    g["n"].add(sum(sent) // (8 * (k - 1)))  # sum of dp_bytes = 2 (k-1) n floats
            if len(g["raw"]) < (rnd + 1) * a.raw_rounds:
                g["raw"] += raw(a.build, k, max(g["n"]), a.raw_rounds)["seconds"]
            print(f"round {rnd}: {model} dp {k}: exchange {statistics.median(g['least']) * 1e3:.1f} ms (least rank), "
                  f"raw {statistics.median(g['raw']) * 1e3:.1f} ms", file=sys.stderr, flush=True)
    other = watch.share()
    shutil.rmtree(scratch, ignore_errors=True)
    rows = []
    for c in cells:
        model, k = c
        g = got[c]
        least, most, rw = spread(g["least"]), spread(g["most"]), spread(g["raw"])
        rows.append({"model": model, "dp": k, "floats": max(g["n"]), "bytes_per_rank": sorted(g["bytes"]),
                     "planned_bytes_per_rank": g["planned"], "exchange_least_s": least, "exchange_most_s": most,
                     "raw_s": rw, "ratio_least_over_raw": least["median"] / rw["median"],
                     "ratio_most_over_raw": most["median"] / rw["median"],
                     "ratio_min_least_over_min_raw": least["min"] / rw["min"]})
    out = {"when": time.strftime("%Y-%m-%d %H:%M:%S"), "rounds": a.rounds, "steps": a.steps, "warmup": a.warmup,
           "raw_rounds": a.raw_rounds, "other_cpu": other, "cpus": os.cpu_count(), "rows": rows}
    ms = lambda s: f"{s['median'] * 1e3:.1f} ({s['min'] * 1e3:.1f}-{s['max'] * 1e3:.1f})"  # noqa: E731
    md = ["# dp all-reduce: workers' exchange vs the raw-socket bound (bench/dp.py, issue 17)", "",
          f"{out['when']}; bench models (bench/jobs) at pp 1, dp 2 and 3, zero 0, 1f1b with one microbatch of 2 "
          f"sequences per replica, 1-thread workers on this host ({os.cpu_count()} CPUs: dp 3 shares them); "
          f"{a.rounds} interleaved rounds of {a.steps} steps (the first {a.warmup} not counted), and per round "
          f"{a.raw_rounds} all-reduces of bench_coll. " + quiet_note(other, WHY), "",
          "Exchange: the step reports' dp_seconds, per step the smallest over the ranks (the replica that came "
          "last, waiting least for the others; the others' shards to it were sent while it computed, so it can "
          "take less than an all-reduce that starts together) and the largest (the first to come, waiting for the "
          "others' compute too); raw: bench_coll, the same floats in the same "
          "pattern (direct reduce-scatter, ordered sums a 65536-float chunk at a time, each summed chunk sent on) "
          "between busy-polled processes over loopback TCP (a poll that moved nothing yields the core), the slowest "
          "member's time. Milliseconds, median "
          "(min-max).", "",
          "| model | dp | floats | bytes sent per rank (plan) | exchange, least rank | exchange, most | raw bound | "
          "least / raw | most / raw | min least / min raw |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['model']} | {r['dp']} | {r['floats']} | {', '.join(map(str, r['bytes_per_rank']))} "
                  f"({r['planned_bytes_per_rank']}) | {ms(r['exchange_least_s'])} | {ms(r['exchange_most_s'])} | "
                  f"{ms(r['raw_s'])} | {r['ratio_least_over_raw']:.2f} | {r['ratio_most_over_raw']:.2f} | "
                  f"{r['ratio_min_least_over_min_raw']:.2f} |")
    text = "\n".join(md) + "\n"
    os.makedirs(os.path.join(HERE, "results", "dp"), exist_ok=True)
    base = os.path.join(HERE, "results", "dp", a.out)
    json.dump(out, open(base + ".json", "w"), indent=1)
    open(base + ".md", "w").write(text)
    print(text)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""trace_step: where a pipelined step goes, rank by rank (issue 16 part 4).

    python3 bench/trace_step.py --build build-bench --job bench/jobs/gpt-d768.json \\
        [--pp 2] [--schedule zb-h1] [-m 8] [--steps 6] [--warmup 2] [--rounds 3] [--out bench/results/trace/d768]

Runs, interleaved over --rounds (A B C, then rotated), on fresh 1-thread workers (pipe.py):
  A  the job as a pp-rank pipeline, every step traced;
  B  the same plan serialized: batch = one microbatch and m = 1, so the ranks take turns — each
     stage's layers alone (only actions no other rank overlapped count), at the same thread
     count, on the same microbatch shape;
  C  the single process (pp = 1, one thread, the same microbatches), for the whole model's sum.
For every timed step (after --warmup, not the last) of A each rank's step is split from its own
traces (worker step reports: `actions` and `trace`): compute per action kind, waiting for a frame
(an action's inputs not yet there), handing outputs on (sends, local copies), the step end's wait
for peers (norm partials, tied and data-parallel exchanges) and its own work (reductions, the
optimizer), and what the trace does not cover; `after` is the eval work after the step's mark (a
pipeline rank's snapshot is taken in the next step's first idle wait, so it counts in wait). Compute per microbatch is then set against B's for the same stage and kind: a ratio
> 1 is the layers running slower beside another rank (shared caches, memory bandwidth, a core
shared with the loop threads) than alone. Medians over steps, then over rounds (min-max beside).
Writes OUT.json (everything) and OUT.md (the tables) and prints the markdown."""
import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import pipe  # noqa: E402
from benchlib import env_for, loadavg, log  # noqa: E402

KINDS = ("F", "B", "I", "W")



def sched_actions(rep):
    """The schedule's actions of a step report (F, B, I, W): the collectives' T and D entries
    that follow them in tp / dp runs are not the schedule's."""
    return [a for a in rep["actions"] if a[0] in ("F", "B", "I", "W")]

def med(x):
    return statistics.median(x) if x else None


def job_of(path, pp, sched, m, batch, steps):
    with open(os.path.join(ROOT, path)) as f:
        j = json.load(f)
    batch = batch or j["train"]["batch_size"]
    j["mesh"].update(pp=pp, dp=1, virtual_stages=1)
    j["schedule"].update(name=sched, microbatches=m)
    j["train"].update(steps=steps, batch_size=batch, snapshot_every=j["train"].get("snapshot_every", 1))
    if not os.path.isabs(j["data"]["path"]):
        j["data"]["path"] = os.path.join(ROOT, j["data"]["path"])
    return j


def split_step(rep):
    """One rank's traced step report -> its parts in seconds."""
    acts, tr = sched_actions(rep), rep["trace"]
    out = {"step": rep["step_time"], "wait": 0.0, "send": 0.0, "end_wait": tr["end_wait"],
           "end_work": tr["end_work"], "after": tr["after"], "sleeps": tr.get("sleeps", 0)}
    per = {k: [] for k in KINDS}
    for (kind, _mb, _st, t0, t1), ready, routed in zip(acts, tr["ready"], tr["routed"]):
        per[kind].append(t1 - t0)
        out["wait"] += t0 - ready
        out["send"] += routed - t1
    for k in KINDS:
        out[k] = sum(per[k])
        out[k + "_n"] = len(per[k])
    out["other"] = out["step"] - sum(out[k] for k in ("F", "B", "I", "W", "wait", "send", "end_wait", "end_work"))
    out["stages"] = sorted({a[2] for a in acts})
    return out


def per_rank(res, warmup, steps):
    ranks = []
    for rep in res["reports"]:
        got = [split_step(x) for x in rep if warmup <= x["step"] < steps - 1 and "actions" in x and "trace" in x]
        if not got:
            raise RuntimeError("no traced step reports (is the worker built from this tree?)")
        row = {k: med([g[k] for g in got]) for k in got[0] if k != "stages"}
        row["stages"], row["steps"] = got[0]["stages"], len(got)
        ranks.append(row)
    return ranks


def per_mb(res, warmup, steps):
    """(stage, kind) -> median seconds of one action (one microbatch)."""
    d = {}
    for rep in res["reports"]:
        for x in rep:
            if warmup <= x["step"] < steps - 1 and "actions" in x:
                for kind, _mb, st, t0, t1 in sched_actions(x):
                    d.setdefault((st, kind), []).append(t1 - t0)
    return {k: med(v) for k, v in d.items()}


def overlap(res, warmup, steps):
    """(stage, kind) -> ([seconds of actions no other rank overlapped by more than 10 %],
    [seconds of actions another rank computed through for at least 90 %]), on the hosts'
    shared monotonic clock (trace.t0): the same layers alone and beside another rank, in one run."""
    iv = {}  # step -> rank -> [(t0, t1, stage, kind)]
    for r, rep in enumerate(res["reports"]):
        for x in rep:
            if warmup <= x["step"] < steps - 1 and "actions" in x and "trace" in x:
                b = x["trace"]["t0"]
                iv.setdefault(x["step"], {})[r] = [(b + t0, b + t1, st, k) for k, _mb, st, t0, t1 in sched_actions(x)]
    out = {}
    for ranks in iv.values():
        for r, acts in ranks.items():
            others = [a for q, o in ranks.items() if q != r for a in o]
            for t0, t1, st, k in acts:
                if t1 <= t0:
                    continue
                cover = sum(max(0.0, min(t1, u1) - max(t0, u0)) for u0, u1, _, _ in others) / (t1 - t0)
                lo, hi = out.setdefault((st, k), ([], []))
                if cover <= 0.1:
                    lo.append(t1 - t0)
                elif cover >= 0.9:
                    hi.append(t1 - t0)
    return out


def stage_layers(res):
    return [s["layer_range"] for s in res["plan"]["partition"]["stages"]]


def run_one(a, job, tag):
    out = os.path.join(a.scratch, tag)
    try:
        return pipe.run(a.build, job, out, trace_every=1, env=env_for(1, a.coretype))
    finally:
        shutil.rmtree(out, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build-bench"))
    ap.add_argument("--job", default="bench/jobs/gpt-d768.json")
    ap.add_argument("--pp", type=int, default=2)
    ap.add_argument("--schedule", default="zb-h1")
    ap.add_argument("-m", type=int, default=8)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--coretype", default="", help="as harness.py: '' keeps the environment's, auto unsets it")
    ap.add_argument("--out", default=None, help="result stem (default bench/results/trace/<job name>-pp<pp>)")
    a = ap.parse_args()
    a.build = os.path.abspath(a.build)
    if a.steps < a.warmup + 2:
        ap.error("--steps must leave at least one timed step after --warmup (the last is not timed)")
    base = job_of(a.job, 1, a.schedule, 1, 0, 1)
    B = base["train"]["batch_size"]
    if B % a.m:
        ap.error(f"-m {a.m} does not divide the job's batch_size {B}")
    mb = B // a.m
    a.out = a.out or os.path.join(HERE, "results", "trace", f"{base['name']}-pp{a.pp}")
    a.scratch = tempfile.mkdtemp(prefix="pw-trace-")
    jobs = {"pipelined": job_of(a.job, a.pp, a.schedule, a.m, B, a.steps),
            "alone": job_of(a.job, a.pp, a.schedule, 1, mb, a.steps),
            "single": job_of(a.job, 1, "1f1b", a.m, B, a.steps)}
    got = {k: [] for k in jobs}
    loads = []
    order = list(jobs)
    try:
        for rd in range(a.rounds):
            for k in order[rd % 3:] + order[:rd % 3]:
                log(f"trace_step: round {rd + 1} of {a.rounds}: {k}")
                loads.append(loadavg())
                got[k].append(run_one(a, jobs[k], f"{k}-{rd}"))
    finally:
        shutil.rmtree(a.scratch, ignore_errors=True)
    w, n = a.warmup, a.steps
    lay = [stage_layers(r) for r in got["pipelined"] + got["alone"]]
    same_split = all(x == lay[0] for x in lay)
    rounds = [per_rank(r, w, n) for r in got["pipelined"]]
    period = [pipe.step_period(r, w) for r in got["pipelined"]]
    mb_pipe = [per_mb(r, w, n) for r in got["pipelined"]]
    # the serialized run's actions no other rank overlapped; under zb-h1 the last stage's W runs
    # beside the stage before's I even at m = 1: those fall back to all of theirs (marked)
    mb_ser = [per_mb(r, w, n) for r in got["alone"]]
    lone = [{k: med(lo) for k, (lo, _hi) in overlap(r, w, n).items() if lo} for r in got["alone"]]
    mb_alone = [{**a, **b} for a, b in zip(mb_ser, lone)]
    overlapped = {k for k in mb_ser[0] if not all(k in x for x in lone)}
    mb_single = [per_mb(r, w, n) for r in got["single"]]
    ov = {}
    for r in got["pipelined"]:
        for key, (lo, hi) in overlap(r, w, n).items():
            ov.setdefault(key, ([], []))[0].extend(lo)
            ov[key][1].extend(hi)
    ov_rows = [{"stage": st, "kind": k, "alone_n": len(lo), "beside_n": len(hi),
                "alone_ms": med(lo) * 1e3 if lo else None, "beside_ms": med(hi) * 1e3 if hi else None,
                "ratio": med(hi) / med(lo) if lo and hi else None}
               for (st, k), (lo, hi) in sorted(ov.items())]
    single_step = [med([r["step_time"] for r in x["reports"][0] if w <= r["step"] < n - 1]) for x in got["single"]]
    S = len(got["pipelined"][0]["plan"]["partition"]["stages"])
    stage_rank = got["pipelined"][0]["plan"]["stage_to_rank"]
    cmp_rows = []
    for st in range(S):
        for kind in KINDS:
            pr = [p.get((st, kind)) for p in mb_pipe]
            al = [q.get((st, kind)) for q in mb_alone]
            if None in pr or None in al:
                continue
            ratios = [x / y for x, y in zip(pr, al)]
            cmp_rows.append({"stage": st, "rank": stage_rank[st], "kind": kind, "pipelined_ms": med(pr) * 1e3,
                             "alone_ms": med(al) * 1e3, "ratio": med(ratios),
                             "alone_overlapped": (st, kind) in overlapped,
                             "ratio_spread": [min(ratios), max(ratios)]})
    # the whole model: every stage's F (resp. backward) against the single process's
    tot = {}
    for name, src in (("pipelined", mb_pipe), ("alone", mb_ser), ("single", mb_single)):
        f = [sum(v for (st, k), v in x.items() if k == "F") for x in src]
        b = [sum(v for (st, k), v in x.items() if k != "F") for x in src]
        tot[name] = {"F_ms": med(f) * 1e3, "backward_ms": med(b) * 1e3}
    res = {"job": base["name"], "pp": a.pp, "schedule": a.schedule, "m": a.m, "microbatch": mb,
           "steps": n, "warmup": w, "rounds": a.rounds, "loadavg": loads, "same_partition": same_split,
           "coretype": os.environ.get("OPENBLAS_CORETYPE", "") if a.coretype == "" else a.coretype,
           "period_ms": [p * 1e3 for p in period], "single_step_ms": [s * 1e3 for s in single_step],
           "ranks": rounds, "compute_vs_alone": cmp_rows, "in_run_overlap": ov_rows, "whole_model": tot}
    md = render(res)
    with open(a.out + ".json", "w") as f:
        json.dump(res, f, indent=1)
    with open(a.out + ".md", "w") as f:
        f.write(md)
    print(md)


def render(res):
    ms = lambda x: f"{x * 1e3:.1f}"  # noqa: E731
    L = [f"# Where a step goes: {res['job']}, pp = {res['pp']} {res['schedule']}, m = {res['m']} "
         f"(microbatch {res['microbatch']}), 1-thread workers",
         "",
         f"{res['rounds']} rounds × {res['steps'] - res['warmup'] - 1} timed steps (warm-up {res['warmup']}, the last "
         f"not timed); OPENBLAS_CORETYPE={res['coretype'] or '(unset)'}; load average at each run "
         f"{min(res['loadavg']):.2f}–{max(res['loadavg']):.2f}. Step period "
         f"{med(res['period_ms']):.1f} ms ({min(res['period_ms']):.1f}–{max(res['period_ms']):.1f}); the single "
         f"process on one thread {med(res['single_step_ms']):.1f} ms.",
         "" if res["same_partition"] else "\n**The serialized run's partition differed from the pipelined one: "
         "the compute comparison below is not of the same layers.**\n",
         "Per rank, ms per step (median of the rounds' medians). wait = an action's inputs not yet there; "
         "send = handing its outputs on; end wait / end work = the step end waiting for peers / reducing and "
         "updating; other = the step's time the traces do not cover; after = eval, after the step's mark (in "
         "the period, not in the step time; a snapshot counts in wait, taken in the first idle wait); waits "
         "that slept = waits that went to sleep in poll() (after a spin of up to 1 ms, none on a busy host), "
         "each paying a wake-up (per step).",
         "",
         "| rank | stages | step | F | B | I | W | wait | send | end wait | end work | other | after | waits that slept |",
         "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in range(len(res["ranks"][0])):
        v = {k: med([rd[r][k] for rd in res["ranks"]]) for k in res["ranks"][0][r] if k != "stages"}
        L.append(f"| {r} | {','.join(map(str, res['ranks'][0][r]['stages']))} | {ms(v['step'])} | "
                 + " | ".join(ms(v[k]) if v[k + '_n'] else "–" for k in KINDS) + " | "
                 + " | ".join(ms(v[k]) for k in ("wait", "send", "end_wait", "end_work", "other", "after"))
                 + f" | {v['sleeps']:g} |")
    L += ["", "Compute per action (one microbatch) beside the same stage's action alone (the serialized run: no "
          "other rank computing), ms; ratio > 1: slower beside the other ranks. * = even serialized, another rank's "
          "action always overlapped it (zb-h1: the last stage's W and the stage before's I); all of them counted.", "",
          "| stage | rank | kind | pipelined | alone | ratio (min–max) |", "|---|---|---|---|---|---|"]
    for c in res["compute_vs_alone"]:
        L.append(f"| {c['stage']} | {c['rank']} | {c['kind']} | {c['pipelined_ms']:.2f} | {c['alone_ms']:.2f}"
                 f"{' *' if c['alone_overlapped'] else ''} | "
                 f"{c['ratio']:.3f} ({c['ratio_spread'][0]:.3f}–{c['ratio_spread'][1]:.3f}) |")
    L += ["", "The same, inside the pipelined run: actions during which no other rank computed (≤ 10 % overlap, on "
          "the host's monotonic clock) against those another rank computed through (≥ 90 %), ms (count).", "",
          "| stage | kind | alone in the run | beside another rank | ratio |", "|---|---|---|---|---|"]
    f2 = lambda v, c: f"{v:.2f} ({c})" if v is not None else f"– ({c})"  # noqa: E731
    for o in res["in_run_overlap"]:
        L.append(f"| {o['stage']} | {o['kind']} | {f2(o['alone_ms'], o['alone_n'])} | "
                 f"{f2(o['beside_ms'], o['beside_n'])} | {o['ratio']:.3f} |" if o["ratio"] else
                 f"| {o['stage']} | {o['kind']} | {f2(o['alone_ms'], o['alone_n'])} | "
                 f"{f2(o['beside_ms'], o['beside_n'])} | – |")
    t = res["whole_model"]
    L += ["", "One microbatch through every stage, ms (Σ over stages; the single process runs the whole model):", "",
          "| | pipelined | serialized | single process |", "|---|---|---|---|",
          f"| F | {t['pipelined']['F_ms']:.2f} | {t['alone']['F_ms']:.2f} | {t['single']['F_ms']:.2f} |",
          f"| backward (B, or I + W) | {t['pipelined']['backward_ms']:.2f} | {t['alone']['backward_ms']:.2f} | "
          f"{t['single']['backward_ms']:.2f} |", ""]
    return "\n".join(L)


if __name__ == "__main__":
    main()

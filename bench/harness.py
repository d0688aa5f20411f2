"""harness: runs the cases of bench/run.sh and writes bench/results/harness/latest.{json,md}.

    /usr/bin/python3 bench/harness.py --build BUILD_DIR [--quick] [--out DIR]
                                      [--coretype NAME] [--cases 1,2]

Every comparison is measured in this run, interleaved A B A B, so load from
other processes hits both sides; each figure is the median over repeated
runs, and the load average is recorded next to it. Cases that need parts
of pipewright which do not exist yet are listed with "not yet measured" and
the reason, never with a number. Needs only the standard library (PyTorch is
used by bench/torch_step.py, run with /usr/bin/python3).
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cases_rt  # noqa: E402
import costmodel  # noqa: E402
from benchlib import PY, Server, env_for, loadavg, log, spread, torch_cmd, torch_env  # noqa: E402,F401

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

KERNEL_JOBS = ["examples/jobs/gpt-tiny.json", "examples/jobs/llama-tiny.json",
               "bench/jobs/gpt-d256.json", "bench/jobs/gpt-d512.json", "bench/jobs/gpt-d768.json"]
STEP_JOBS = ["bench/jobs/gpt-d256.json", "bench/jobs/gpt-d512.json", "bench/jobs/gpt-d768.json"]
QUICK_SKIP = "bench/jobs/gpt-d768.json"  # minutes per step pair on one thread


def sh(cmd, **kw):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, check=True, **kw).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def machine_info():
    cpu = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    flags = ""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                flags = line
                break
    commit = sh(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"]) or "none"
    dirty = sh(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"])
    torch_v = sh([PY, "-c", "import torch; print(torch.__version__)"])
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "avx512f": " avx512f" in flags,
        "kernel": platform.release(),
        "gcc": (sh(["gcc", "--version"]) or "?").splitlines()[0],
        "torch": torch_v or "not importable",
        "commit": commit + ("+dirty" if dirty else ""),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "loadavg_start": loadavg(),
    }


# ---------------------------------------------------------------------------
# Case 1: kernels vs the limit.

def case_kernels(a):
    reps, target = (3, 20) if a.quick else (7, 60)
    la0 = loadavg()
    out = sh([os.path.join(a.build, "bench", "bench_kernels"), "--reps", str(reps), "--target-ms",
              str(target)] + KERNEL_JOBS, cwd=ROOT, env=env_for(1, a.coretype))
    if out is None:
        raise SystemExit("bench_kernels failed")
    res = json.loads(out)
    res["loadavg"] = [la0, loadavg()]
    return res


# ---------------------------------------------------------------------------
# Case 2: training step vs PyTorch.

def interleaved_rounds(a, job, threads, warmup, rounds, steps, probe):
    """pipewright and PyTorch, both resident, alternate single training steps
    A B B A ... (each idle while the other computes), `steps` pairs per
    round, `rounds` rounds. With probe (one thread), the bare sgemms of one
    step's linear layers run between them twice: with the kernels in use and
    in a second process with the CPU's own kernels (OPENBLAS_CORETYPE unset).
    Returns per-round lists of (pipewright ms, PyTorch ms) pairs and the
    probes' [(ms, gflop)] lists."""
    env_t, policy = torch_env(a, job, threads)
    bench_step = os.path.join(a.build, "bench", "bench_step")
    pw = Server([bench_step, "--job", job, "--threads", str(threads)], env_for(threads, a.coretype))
    th = Server(torch_cmd(job, threads), env_t)
    nat = Server([bench_step, "--job", job, "--sgemm-only"], env_for(1, "auto")) if probe else None
    pairs, g_use, g_nat = [], [], []
    try:
        for _ in range(warmup):
            pw.step()
            th.step()
        for r in range(rounds):
            rp = []
            for i in range(steps):
                if i % 2 == 0:
                    p_ms = pw.step()
                    t_ms = th.step()
                else:
                    t_ms = th.step()
                    p_ms = pw.step()
                rp.append((p_ms, t_ms))
                if probe:
                    x = pw.cmd("sgemm")
                    g_use.append((x["ms"], x["gflop"]))
                    x = nat.cmd("sgemm")
                    g_nat.append((x["ms"], x["gflop"]))
            pairs.append(rp)
    finally:
        pw.close()
        th.close()
        if nat:
            nat.close()
    return pairs, g_use, g_nat, policy


def step_plan(a, kj):
    """(warm-up, rounds, steps per round) for a model: at least 3 rounds and
    10 timed steps per side in a full run; the quick run is below that bar
    and says so."""
    big = kj["d_model"] >= 512
    if a.quick:
        return 1, 3, (2 if big else 4)
    return (1 if big else 2), 3, (4 if big else 10)


def case_step(a, kernels):
    flops = {j["job"]: j for j in kernels["jobs"]}
    rows = []
    for job in STEP_JOBS:
        if job not in flops or (a.quick and job == QUICK_SKIP):
            continue
        kj = flops[job]
        W, R, K = step_plan(a, kj)
        tokens = kj["batch_size"] * kj["seq_len"]
        for threads in (1, 2):
            la0 = loadavg()
            log(f"case 2: {kj['name']}, {threads} thread(s): {W} warm-up, {R} rounds of {K} steps each, alternating")
            pairs, gu, gn, policy = interleaved_rounds(a, job, threads, W, R, K, probe=threads == 1)
            p = [x for rp in pairs for x, _ in rp]
            t = [y for rp in pairs for _, y in rp]
            pw_ms, th_ms = statistics.median(p), statistics.median(t)
            per_round = [statistics.median(y / x for x, y in rp) for rp in pairs]
            gf = kj["flops_per_step"]["total"]

            def rate(g):
                return g[0][1] / (statistics.median(x[0] for x in g) * 1e-3) if g else None
            peak_use, peak_nat = rate(gu), rate(gn)

            def frac(ms, peak):
                return gf / (ms * 1e-3) * 1e-9 / peak if peak and threads == 1 else None
            rows.append({
                "job": job, "name": kj["name"], "threads": threads, "warmup": W, "rounds": R,
                "steps_per_round": K, "torch_omp_wait_policy": policy,
                "pipewright_ms": pw_ms, "torch_ms": th_ms,
                "pipewright_tokens_per_s": tokens / pw_ms * 1e3,
                "torch_tokens_per_s": tokens / th_ms * 1e3,
                # the median of the ratios of adjacent steps (PyTorch ms / pipewright ms,
                # i.e. pipewright tokens/s over PyTorch's), and the rounds' medians' range
                "ratio": statistics.median(y / x for x, y in zip(p, t)),
                "ratio_rounds": per_round, "ratio_spread": spread(per_round),
                "pipewright_steps_ms": p, "torch_steps_ms": t,
                "sgemm_probe_ms": [x[0] for x in gu], "sgemm_native_probe_ms": [x[0] for x in gn],
                "model_gflop_per_step": gf * 1e-9,
                "sgemm_gflops": peak_use, "sgemm_native_gflops": peak_nat,
                "pipewright_peak_fraction": frac(pw_ms, peak_use),
                "torch_peak_fraction": frac(th_ms, peak_use),
                "pipewright_native_peak_fraction": frac(pw_ms, peak_nat),
                "torch_native_peak_fraction": frac(th_ms, peak_nat),
                "loadavg": [la0, loadavg()],
            })
    return rows


# ---------------------------------------------------------------------------
# Cases 2 (pp = 2) to 7: the worker runtime, transport, coordinator (bench/cases_rt.py).

def run_rt_cases(a, res, cases):
    import tempfile
    a.scratch = tempfile.mkdtemp(prefix="pw-bench-")
    env = env_for(1, a.coretype)

    def guard(key, fn, *args):
        la0, other = loadavg(), costmodel.OtherCpu()
        try:
            res[key] = fn(*args)
        except Exception as e:  # a failed case is reported, the run goes on
            res[key] = {"error": f"{type(e).__name__}: {e}"[:400]}
        if isinstance(res[key], dict):
            res[key]["loadavg"] = [la0, loadavg()]
            res[key]["other_cpu"] = other.share()

    if "2" in cases:
        log("case 2: pp = 2 pipelines of two 1-thread workers against one process on 2 threads")
        guard("pp2", cases_rt.case_pp2, a, env)
    if "3" in cases or "6" in cases:
        log("case 3/6: pipeline efficiency and memory, pp = 2, 4, four schedules")
        guard("pipeline", cases_rt.case_pipeline, a, env)
    if "4" in cases:
        log("case 4: runtime overhead (2 layers, d = 64, batch 2)")
        guard("overhead", cases_rt.case_overhead, a, env)
    if "5" in cases:
        log("case 5: transport vs raw socket stream")
        guard("transport", cases_rt.case_transport, a)
    if "7" in cases:
        log("case 7: control plane (wrk)")
        guard("control", cases_rt.case_control, a)
    if "8" in cases:
        log("case 8: the calibrated cost model, predicted vs measured step (pp x m x model)")
        models = ["d256"] if a.quick else ["d256", "d512", "d768"]
        guard("costmodel", costmodel.grid, a.build, models, [1, 2, 4], [2, 4, 8, 16], 1 if a.quick else 3, 5, 2)
    import shutil
    shutil.rmtree(a.scratch, ignore_errors=True)


def yn(ok):
    return "met" if ok else "**missed**"


def rng(x, nd=2, unit=""):
    """'median (min–max)' for a figure and its rounds' spread."""
    return f"{x[0]:.{nd}f}{unit}" + (f" ({x[1][0]:.{nd}f}–{x[1][1]:.{nd}f})" if x[1] else "")


def mem_runs(res):
    """Every pipeline run whose ranks were sampled for memory (cases 2 pp = 2 and 3)."""
    runs = []
    for m in (res.get("pp2") or {}).get("models", {}).values():
        runs += m["rows"]
    p = res.get("pipeline")
    if p and "error" not in p:
        runs += [r for r in p["rows"] if "error" not in r]
    return runs


def targets_md(res):
    """One line per target of issues 8 and 16: met / missed, with the figure."""
    T = []
    for r in res.get("step", []):
        if r["threads"] == 1:
            T.append((f"step vs PyTorch (foreach AdamW), 1 thread, {r['name']}: ≥ 1.25×",
                      rng((r["ratio"], r.get("ratio_spread")), 2, "×"), r["ratio"] >= 1.25))
    for name, m in (res.get("pp2") or {}).get("models", {}).items():
        for r in m["rows"]:
            T.append((f"{name} pp = 2 {r['schedule']} vs one process on 2 threads: ≥ 1.1×",
                      rng((r["vs_single_2t"], r["vs_single_2t_spread"]), 2, "×"), r["vs_single_2t"] >= 1.1))
            T.append((f"{name} pp = 2 {r['schedule']} efficiency (÷ 1-thread single × 2): ≥ 0.9",
                      rng((r["efficiency"], r["efficiency_spread"])), r["efficiency"] >= 0.9))
    o = res.get("overhead")
    if o and "error" not in o:
        x = o["pp1"]
        T.append(("runtime overhead at pp = 1: ≤ 20 µs/step",
                  rng((x["overhead_us_per_step"], x.get("overhead_us_per_step_spread")), 0, " µs"),
                  x["overhead_us_per_step"] <= 20))
        x = o["pp2"]
        T.append(("overhead per action above a same-round wake-up, pp = 2: ≤ 5 µs",
                  rng((x["over_wake_us_per_action"], x.get("over_wake_spread")), 1, " µs"),
                  x["over_wake_us_per_action"] <= 5))
    runs = mem_runs(res)
    if runs:
        bad = [(r, m) for r in runs for m in r["memory"]
               if not (m["minflt_per_step"] == 0 and m["rss_growth_per_step"] <= 0 and m["vmdata_growth_per_step"] <= 0)]
        T.append(("no page faults / RSS growth per step in steady state",
                  f"{len(bad)} of {sum(len(r['memory']) for r in runs)} ranks with any", not bad))
    tr = res.get("transport")
    if tr and "error" not in tr:
        worst = min(tr["rows"], key=lambda r: r["ratio"])
        T.append(("transport ≥ 0.9 of the best raw path (worst size/mode)",
                  f"{worst['ratio']:.2f} ({worst['size'] >> 10} KiB {worst['mode']}, vs {worst.get('best_raw', 'raw')})",
                  worst["ratio"] >= 0.9))
    cm = res.get("costmodel")
    if cm and "error" not in cm:
        ok = sum(r["within_10pct"] for r in cm["rows"])
        worst = max(cm["rows"], key=lambda r: abs(r["error"]))
        T.append(("cost model: predicted step within 10 % of the measured, every cell (case 8)",
                  f"{ok} of {len(cm['rows'])} cells; worst {100 * worst['error']:+.1f} % ({worst['model']} pp "
                  f"{worst['pp']} m {worst['m']})", ok == len(cm["rows"])))
        for c in cm["auto"]:
            x, b = c["auto"], c["fastest"]
            T.append((f"{c['model']}: `plan --auto`'s choice within 5 % of the fastest measured",
                      f"pp {x['pp']} {x['schedule']} m {x['m']}: {x['measured_ms'] / b['measured_ms']:.3f}× the "
                      f"fastest", c["within_5pct"]))
    c = res.get("control")
    if c and "error" not in c:
        w = c["jobs"]
        T.append(("GET /v1/jobs/{id} ≥ 5000 req/s, p99 < 5 ms, 0 errors",
                  f"{fmt(w['rps'], 0)} req/s, p99 {fmt(w['p99_ms'], 2)} ms, {w['errors']} errors",
                  (w["rps"] or 0) >= 5000 and (w["p99_ms"] or 1e9) < 5 and w["errors"] == 0))
    L = ["## Targets\n", "Figures: median over rounds, the rounds' range in parentheses.\n",
         "| target | measured | |", "|---|---|---|"]
    L += [f"| {t} | {v} | {yn(ok)} |" for t, v, ok in T]
    L.append("\nWhere targets are missed, bench/README.md (Notes) says where the time goes.\n")
    return L


def other_note(x):
    """What else ran during a case (costmodel.py's OtherCpu): figures are indicative above 5 %."""
    if not isinstance(x, dict) or x.get("other_cpu") is None:
        return ""
    o = x["other_cpu"]
    return (f"Other processes used {100 * o:.0f} % of the machine's CPUs during this case"
            + (": **indicative** figures (the lead re-runs them quietly).\n" if o > 0.05 else ".\n"))


def cases_rt_md(res):
    L = []
    p = res.get("pipeline")
    if p:
        L.append("## Case 3: pipeline efficiency (GPT d=128, 8 layers, T=64, B=16, m = 8; 1-thread workers sharing "
                 f"{res['machine']['cores']} cores)\n")
        L.append(other_note(p))
        if "error" in p:
            L.append(f"failed: {p['error']}\n")
        else:
            L.append(f"Single rank (pp = 1, same job, through the worker): {p['single_rank_period_s'] * 1e3:.1f} ms/step "
                     f"(median of {p.get('rounds', 1)} rounds; each configuration's row is its round with the median "
                     "efficiency, the rounds' efficiencies in the last column). "
                     "Efficiency = measured tokens/s ÷ (single-rank tokens/s × pp): the bubble, the transfers and "
                     "the sharing of cores all count against it; with pp = 4 on 2 cores it cannot exceed 0.5. "
                     "Measured bubble: 1 − Σ action time ÷ (pp × last action end) on the traced steps; replayed: the "
                     "plan replayed with the measured per-action costs and zero transfer cost; planned: the "
                     "planner's FLOP-model bubble.\n")
            L.append("| pp | schedule | V | ms/step | tok/s | single rank × pp tok/s | efficiency | target | bubble: measured "
                     "| replayed (measured costs) | planned | efficiency of each round |")
            L.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
            for r in p["rows"]:
                if "error" in r:
                    L.append(f"| {r['pp']} | {r['schedule']} | {r['V']} | failed: {r['error']} | | | | | | | | |")
                    continue
                tgt = "-"
                L.append(f"| {r['pp']} | {r['schedule']} | {r['V']} | {r['step_period_s'] * 1e3:.1f} | {r['tokens_per_s']:.0f} "
                         f"| {r['ideal_tokens_per_s']:.0f} | {r['efficiency']:.2f} | {tgt} | {r['measured_bubble']:.3f} "
                         f"| {r['replay_bubble']:.3f} | {r['planned_bubble']:.3f} | "
                         + " ".join(f"{e:.2f}" for e in r.get("efficiency_rounds", [])) + " |")
            L.append("")
    o = res.get("overhead")
    if o:
        L.append("## Case 4: runtime overhead (GPT 2 layers, d=64, T=64, batch 2, m = 1)\n")
        L.append(other_note(o))
        if "error" in o:
            L.append(f"failed: {o['error']}\n")
        else:
            L.append(f"{o.get('rounds', 1)} rounds; each takes its own in-process step (`pipewright train`; median "
                     f"{o['inproc_step_s'] * 1e6:.0f} µs) and its own wake-up figure (a process blocked 1 ms, its CPU "
                     f"idle as a worker's threads are between actions, `bench_transport wakeidle`: "
                     + " ".join(f"{w:.1f}" for w in o.get("wake_rounds_us", [o["wake_us"]])) +
                     f" µs; {o['wake_hot_us']:.1f} µs in a hot pipe ping-pong). Overhead = worker step time (median, "
                     "from the workers' own step reports) − the round's in-process step; above one wake-up = overhead "
                     "per action − the round's wake-up. Median of the rounds, their range in parentheses. "
                     "SpectraX reports ≈ 150 µs per step on this case.\n")
            L.append("| pp | worker µs/step | overhead µs/step | actions | µs/action | µs/action above one wake-up | target |")
            L.append("|---|---|---|---|---|---|---|")
            for key in ("pp1", "pp2", "pp1_nosnap", "pp2_nosnap"):
                if key not in o:
                    continue
                x, pp = o[key], int(key[2])
                tgt = f"≤ 20 µs/step: {yn(x['overhead_us_per_step'] <= 20)}" if pp == 1 else \
                    f"≤ 5 µs/action above wake-up: {yn(x['over_wake_us_per_action'] <= 5)}"
                if key.endswith("nosnap"):
                    pp, tgt = f"{pp}, snapshot_every 0", "(not the target's job: what the snapshots cost)"
                L.append(f"| {pp} | {x['worker_step_s'] * 1e6:.0f} "
                         f"| {rng((x['overhead_us_per_step'], x.get('overhead_us_per_step_spread')), 0)} | {x['actions']} "
                         f"| {x['overhead_us_per_action']:.1f} "
                         f"| {rng((x['over_wake_us_per_action'], x.get('over_wake_spread')), 1)} | {tgt} |")
            if o.get("pp2_traced"):
                L.append("\nWhere the pp = 2 worker step goes (traced run, per rank, µs per step, medians; "
                         "`bench/trace_step.py`'s split: wait = an action's input not yet there, send = handing its "
                         "output on, end wait / end work = the step end waiting for the peer's norm partial / reducing "
                         "and updating (and a snapshot no wait of the step took), after = eval passes (a one-rank run's "
                         "snapshot) after the step's mark, in the period but not the step time; a snapshot taken in a "
                         "wait counts in wait):\n")
                L.append("| rank | step | F | B | wait | send | end wait | end work | other | after | waits that slept |")
                L.append("|---|---|---|---|---|---|---|---|---|---|---|")
                for r, x in enumerate(o["pp2_traced"]):
                    L.append(f"| {r} | " + " | ".join(f"{x[k] * 1e6:.0f}" for k in
                             ("step", "F", "B", "wait", "send", "end_wait", "end_work", "other", "after"))
                             + f" | {x.get('sleeps', 0):g} |")
            t = o.get("pp1_traced")
            if t:
                L.append(f"\nWhere the pp = 1 worker step goes (traced run): step {t['step_s'] * 1e6:.0f} µs, of which its "
                         f"actions' own compute {t['actions_s'] * 1e6:.0f} µs; first action starts at "
                         f"{t['first_action_start_s'] * 1e6:.0f} µs, last ends at {t['last_action_end_s'] * 1e6:.0f} µs "
                         f"(gap between the F and the B: {t['gap_between_actions_s'] * 1e6:.0f} µs); "
                         "the rest of the step (after the last action) is the optimizer update, gradient zeroing and the "
                         "step report.")
            L.append("")
    tr = res.get("transport")
    if tr:
        L.append("## Case 5: transport, pipewright frames vs the best raw socket path (loopback TCP, two processes)\n")
        L.append(other_note(tr))
        if "error" in tr:
            L.append(f"failed: {tr['error']}\n")
        else:
            L.append("`bench_transport` (C): pw = what a worker's compute thread does (PWF1 header with the payload's "
                     "crc32c, header + payload in one non-blocking sendmsg, a tensor over 256 KiB as 256 KiB chunk "
                     "frames each CRC'd just before it goes, waiting for the socket only for the rest; "
                     "receiver: non-blocking reads of at most 256 KiB through pw_frame_reader straight into a "
                     "destination buffer, CRC checked, polling the socket for up to 1 ms while nothing comes (yielding the "
                     "core between polls), then poll()); raw = blocking "
                     "write()/read() of the same bytes, no checks; spin = raw with non-blocking calls retried in a "
                     "busy loop (neither end ever sleeps). "
                     "pingpong: a 1-byte answer after every message (time = one hop + a tiny return); stream: back to "
                     "back. The three interleaved in rotating order; ratio = the median over rounds of the faster raw "
                     "path's time ÷ pw's, the rounds' range in parentheses. "
                     f"Latency per hop (0-byte payload, half round trip): pw {tr['hop_latency_us_pw']:.1f} µs, "
                     f"raw {tr['hop_latency_us_raw']:.1f} µs, spin {tr.get('hop_latency_us_spin', float('nan')):.1f} µs.\n")
            L.append("| size | mode | pw µs/msg | raw µs/msg | spin µs/msg | pw GB/s | best raw GB/s | ratio (target ≥ 0.9) |")
            L.append("|---|---|---|---|---|---|---|---|")
            for r in tr["rows"]:
                sz = f"{r['size'] >> 10} KiB" if r["size"] < (1 << 20) else f"{r['size'] >> 20} MiB"
                L.append(f"| {sz} | {r['mode']} | {r['pw_us']:.0f} | {r['raw_us']:.0f} | {fmt(r.get('spin_us'), 0)} "
                         f"| {r['pw_gbytes_per_s']:.2f} | {r['raw_gbytes_per_s']:.2f} "
                         f"| {rng((r['ratio'], r.get('ratio_spread')))} {yn(r['ratio'] >= 0.9)} |")
            L.append("")
    if mem_runs(res):
        L.append(f"## Case 6: steady-state memory per rank (from step {mem_runs(res)[0].get('memory_warmup', 2)} on: the timed steps)\n")
        L.append("Sampled from /proc/PID/stat (minor faults) and /proc/PID/status (VmRSS, VmData, VmHWM) of each "
                 "worker when its step report arrives; per step = difference over the timed steps ÷ their number. "
                 "Heap growth is seen as VmData / VmRSS growth (a malloc'd and touched byte shows up there). Plan "
                 "estimate = the planner's `memory_bytes` for the rank (`pipewright plan --json`, analytics.ranks): "
                 "parameter, gradient and AdamW m, v arenas, activation slots (each holds a stage's values and "
                 "their gradients) × the slots the schedule makes the rank keep, counting early arrivals and "
                 "pending W's, the data set, all-reduce and tied-parameter buffers. It leaves out the process "
                 "baseline (code, libraries, OpenBLAS workspace, thread stacks): peak RSS should exceed it by "
                 "about 6 MiB.\n")
        L.append("| run | rank | minor faults/step | RSS growth B/step | VmData growth B/step | target (none) "
                 "| peak RSS MiB | plan estimate MiB | peak in-flight act. (measured / plan) |")
        L.append("|---|---|---|---|---|---|---|---|---|")
        for r in mem_runs(res):
            for m in r["memory"]:
                ok = m["minflt_per_step"] == 0 and m["rss_growth_per_step"] <= 0 and m["vmdata_growth_per_step"] <= 0
                L.append(f"| {r['job']} pp={r['pp']} {r['schedule']} | {m['rank']} | {m['minflt_per_step']:.1f} "
                         f"| {m['rss_growth_per_step']:.0f} | {m['vmdata_growth_per_step']:.0f} | {yn(ok)} "
                         f"| {(m['peak_rss'] or 0) / 2**20:.1f} | {m['plan_estimate'] / 2**20:.1f} "
                         f"| {m['peak_act_measured']} / {m['peak_activations_plan']} |")
        L.append("")
    c = res.get("control")
    if c:
        L.append("## Case 7: control plane (wrk, 1 thread, 4 connections, coordinator on loopback)\n")
        if "error" in c:
            L.append(f"failed: {c['error']}\n")
        else:
            L.append(f"{c['seconds']} s per endpoint; the job (examples/jobs/gpt-tiny.json) is queued (no workers).\n")
            L.append("| endpoint | requests/s | p50 ms | p90 ms | p99 ms | errors (non-2xx + socket) | target |")
            L.append("|---|---|---|---|---|---|---|")
            for k, path in (("jobs", f"GET /v1/jobs/{c['job_id']}"), ("metrics", "GET /metrics")):
                w = c[k]
                tgt = (f"≥ 5000 req/s, p99 < 5 ms, 0 errors: "
                       f"{yn((w['rps'] or 0) >= 5000 and (w['p99_ms'] or 1e9) < 5 and w['errors'] == 0)}"
                       if k == "jobs" else f"0 errors: {yn(w['errors'] == 0)}")
                L.append(f"| {path} | {fmt(w['rps'], 0)} | {fmt(w['p50_ms'], 3)} | {fmt(w['p90_ms'], 3)} "
                         f"| {fmt(w['p99_ms'], 3)} | {w['errors']} | {tgt} |")
            L.append("")
    return L


# ---------------------------------------------------------------------------
# Report.

def fmt(x, nd=1):
    return "-" if x is None else f"{x:.{nd}f}"


def markdown(res):
    m = res["machine"]
    k = res.get("kernels")
    L = []
    L.append(f"# pipewright benchmarks ({'quick' if res['quick'] else 'full'} run)\n")
    L.append(f"- machine: {m['cpu']}, {m['cores']} cores, Linux {m['kernel']}, {m['gcc']}")
    if k:
        L.append(f"- OpenBLAS: {k['openblas_config']} (kernels: {k['openblas_corename']}; "
                 f"OPENBLAS_CORETYPE {res['openblas_coretype_env'] or 'unset'})")
    L.append(f"- PyTorch {m['torch']}; pipewright {m['commit']}; {m['date']}")
    L.append(f"- run took {res['seconds'] / 60:.1f} min; load average (1 min) at start {m['loadavg_start']:.2f}, "
             f"at end {res['loadavg_end']:.2f}"
             " (other processes share the machine: every comparison below is interleaved A B A B"
             " and reported as a median)")
    if res["quick"]:
        L.append("- **quick run**: fewer steps than the bar (≥ 3 rounds, ≥ 10 timed steps per side); the d768 "
                 "model left out. For development only, not for figures.")
    L.append("")

    L.extend(targets_md(res))
    if "step" in res:
        L.append("## Case 2: training step vs PyTorch (float32, AdamW, clipping)\n")
        L.append("| model | threads | rounds × steps | pipewright ms/step | PyTorch ms/step | pipewright tok/s "
                 "| PyTorch tok/s | ratio (rounds' range) | pipewright % of peak: kernels in use / native "
                 "| PyTorch % of peak: in use / native | sgemm GFLOP/s: in use / native | PyTorch wait policy | load |")
        L.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for r in res["step"]:
            def pct(x):
                return "-" if x is None else f"{100 * x:.1f}"
            L.append(f"| {r['name']} | {r['threads']} | {r['rounds']} × {r['steps_per_round']} "
                     f"| {r['pipewright_ms']:.1f} | {r['torch_ms']:.1f} "
                     f"| {r['pipewright_tokens_per_s']:.0f} | {r['torch_tokens_per_s']:.0f} "
                     f"| {rng((r['ratio'], r['ratio_spread']), 2, '×')} "
                     f"| {pct(r['pipewright_peak_fraction'])} / {pct(r['pipewright_native_peak_fraction'])} "
                     f"| {pct(r['torch_peak_fraction'])} / {pct(r['torch_native_peak_fraction'])} "
                     f"| {fmt(r['sgemm_gflops'], 0)} / {fmt(r['sgemm_native_gflops'], 0)} "
                     f"| {r['torch_omp_wait_policy']} | {r['loadavg'][0]:.1f}–{r['loadavg'][1]:.1f} |")
        L.append("")
        L.append("Both trainers stay resident and alternate single steps (A B B A ..., each idle while the other "
                 "computes), in rounds after warm-up steps; ms/step is the median over all timed steps. Ratio = "
                 "the median of the paired ratios (PyTorch ms ÷ pipewright ms of adjacent steps: pipewright "
                 "tokens/s over PyTorch's), the range of the rounds' medians beside it. PyTorch at its fastest "
                 "settings here: the multi-tensor (foreach) AdamW, and on 2 threads the OpenMP wait policy that "
                 "gave it the faster step in a probe before the round. Model FLOPs per step count only the work "
                 "done: the linear layers (6·N·C·OC) and the causal half of attention (6·B·C·T(T+1) per layer: "
                 "T(T+1)/2 query-key pairs, Q·Kᵀ and P·V forward, twice that backward). Peak: the bare "
                 "`cblas_sgemm` calls of the step's linear layers (all three directions), one thread, timed "
                 "between the steps — with the kernels in use (as the environment sets OPENBLAS_CORETYPE) and, "
                 "in a second process, with the CPU's native kernels (OPENBLAS_CORETYPE unset). Two-thread rows: "
                 "pipewright as one process with OpenBLAS on 2 threads (its other kernels run on one).\n")
    pp2 = res.get("pp2")
    if pp2:
        L.append("## Case 2, pp = 2: a pipeline of two 1-thread workers vs one process on 2 threads\n")
        if "error" in pp2:
            L.append(f"failed: {pp2['error']}\n")
        else:
            L.append("| model | schedule | pipeline ms/step | single process 2 threads ms | PyTorch 2 threads ms "
                     "| vs single 2 threads (target ≥ 1.1) | vs PyTorch 2 threads | efficiency (target ≥ 0.9) "
                     "| bubble: measured / replayed / planned | ceiling vs single 2 threads |")
            L.append("|---|---|---|---|---|---|---|---|---|---|")
            for name, m in pp2["models"].items():
                for r in m["rows"]:
                    L.append(f"| {name} | {r['schedule']} m = {r['m']} | {r['ms']:.0f} | {m['single_2t_ms']:.0f} "
                             f"| {m['torch_2t_ms']:.0f} | {rng((r['vs_single_2t'], r['vs_single_2t_spread']), 2, '×')} "
                             f"| {rng((r['vs_torch_2t'], r['vs_torch_2t_spread']), 2, '×')} "
                             f"| {rng((r['efficiency'], r['efficiency_spread']))} "
                             f"| {r['measured_bubble']:.3f} / {r['replay_bubble']:.3f} / {r['planned_bubble']:.3f} "
                             f"| {2 * (1 - r['planned_bubble']) * m['single_2t_ms'] / m['single_1t_ms']:.2f}× |")
            m0 = next(iter(pp2["models"].values()))
            L.append(f"\n{m0['rounds']} rounds; in each, the two pipelines ({m0['pipeline_steps']} steps, "
                     f"{m0['warmup']} warm-up and the last left out; ms/step = wall time between step reports) "
                     f"then {m0['single_steps_per_round']} steps of each resident single-process trainer: "
                     "pipewright on 2 threads and on 1 thread (its best microbatching, m = 1), PyTorch on 2 "
                     f"threads (wait policy {m0['torch_omp_wait_policy']}). Ratios are per round, median with "
                     "the rounds' range. Efficiency = pipeline tokens/s ÷ (1-thread single-process tokens/s × 2). "
                     "Ceiling: the most a pipeline of two 1-thread ranks can reach against the 2-thread process "
                     "on this host, 2 · (1 − planned bubble) · (2-thread ms ÷ 1-thread ms): each rank computing "
                     "half the step at the 1-thread rate with nothing but the schedule's bubble lost. Where the "
                     "process's second OpenBLAS thread nearly doubles its speed, the ceiling is below 1.1 and no "
                     "schedule reaches the target on 2 cores of one host (docs/performance.md says what lifts it "
                     "across hosts).\n")
    L.extend(cases_rt_md(res))
    cm = res.get("costmodel")
    if cm:
        L.append("## Case 8: the calibrated cost model, predicted vs measured step\n")
        if "error" in cm:
            L.append(f"failed: {cm['error']}\n")
        else:
            if cm.get("separate_run"):
                L.append(f"Measured in a separate run ({cm['separate_run']}), not in this one's rounds.\n")
            L.extend(costmodel.md_lines(cm))
            L.append("")

    if k:
        L.append("## Case 1: kernels vs raw cblas_sgemm on the same shapes (1 thread)\n")
        L.append("GFLOP/s of pipewright's kernel / of the bare sgemm call(s), and efficiency = sgemm time / kernel "
                 "time. Linear: N = tokens per microbatch; forward includes the bias, backward_weight the bias "
                 "gradient. Attention: FLOPs counted in full (4·B·T²·C forward, 8·B·T²·C backward); the sgemm "
                 "reference does those full products per (batch, head) on the same packed strides, without "
                 "softmax; pipewright computes only the causal blocks, so it can exceed 1.\n")
        L.append("| model | op | shape | count | forward | backward_input | backward_weight |")
        L.append("|---|---|---|---|---|---|---|")
        for j in k["jobs"]:
            for x in j["linear"]:
                cells = [f"{x[d]['pw_gflops']:.0f} / {x[d]['sgemm_gflops']:.0f} ({x[d]['efficiency']:.2f})"
                         for d in ("forward", "backward_input", "backward_weight")]
                L.append(f"| {j['name']} | linear | N={x['N']} C={x['C']} OC={x['OC']}{'' if x['bias'] else ' no bias'} "
                         f"| {x['count']} | " + " | ".join(cells) + " |")
            for x in j["attention"]:
                cells = [f"{x[d]['pw_gflops']:.0f} / {x[d]['sgemm_gflops']:.0f} ({x[d]['efficiency']:.2f})"
                         for d in ("forward", "backward_input")]
                L.append(f"| {j['name']} | attention | B={x['B']} T={x['T']} C={x['C']} H={x['NH']} "
                         f"| {x['count']} | " + " | ".join(cells) + " | - |")
        L.append("")
        L.append("Per step (all microbatches):\n")
        L.append("| model | GFLOP/step | sgemm GFLOP/s on its linear shapes | linear: pipewright / sgemm ms | attention: pipewright / sgemm ms |")
        L.append("|---|---|---|---|---|")
        for j in k["jobs"]:
            p = j["per_step"]
            L.append(f"| {j['name']} | {j['flops_per_step']['total'] * 1e-9:.2f} | {j['sgemm_gflops_linear_shapes']:.1f} "
                     f"| {p['linear_pw_ms']:.1f} / {p['linear_sgemm_ms']:.1f} | {p['attention_pw_ms']:.1f} / {p['attention_sgemm_ms']:.1f} |")
        L.append("")
        L.append("### Where a step's time goes (each op timed in isolation, per step)\n")
        steps = {r["job"]: r for r in res.get("step", []) if r["threads"] == 1}
        for j in k["jobs"]:
            if "breakdown" not in j:
                continue
            tot = sum(r["ms_per_step"] for r in j["breakdown"])
            meas = steps.get(j["job"])
            L.append(f"**{j['name']}**: sum {tot:.1f} ms" + (f"; measured step {meas['pipewright_ms']:.1f} ms"
                     if meas else "") + ". Ops under 0.1 % left out.\n")
            L.append("| op | direction | calls | ms/step | share |")
            L.append("|---|---|---|---|---|")
            for r in sorted(j["breakdown"], key=lambda r: -r["ms_per_step"]):
                if r["ms_per_step"] < 0.001 * tot:
                    continue
                L.append(f"| {r['op']} | {r['dir']} | {r['calls']} | {r['ms_per_step']:.2f} | {100 * r['ms_per_step'] / tot:.1f} % |")
            if meas and meas["pipewright_ms"] > tot:
                L.append(f"| (rest of the measured step: memsets of gradient buffers, data, glue) | | | "
                         f"{meas['pipewright_ms'] - tot:.2f} | |")
            L.append("")

    return "\n".join(L)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", help="build directory (required unless --rewrite)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "harness"))
    ap.add_argument("--name", default="latest", help="result file stem (default latest)")
    ap.add_argument("--coretype", default="",
                    help="OPENBLAS_CORETYPE for both sides: a core name, or auto (unset: OpenBLAS detects "
                         "the CPU); default: as the environment has it")
    ap.add_argument("--cases", default="1,2,3,4,5,6,7,8", help="1 (kernels) always runs: case 2 needs its figures")
    ap.add_argument("--rewrite", metavar="JSON", help="only render JSON (a result file) to markdown again")
    a = ap.parse_args()
    if a.rewrite:
        with open(a.rewrite) as f:
            res = json.load(f)
        md = markdown(res)
        with open(os.path.splitext(a.rewrite)[0] + ".md", "w") as f:
            f.write(md)
        print(md)
        return
    if not a.build:
        ap.error("--build is required")
    a.build = os.path.abspath(a.build)
    cases = set(a.cases.split(","))
    t0 = time.time()
    res = {"quick": a.quick, "coretype": a.coretype, "machine": machine_info(),
           "openblas_coretype_env": env_for(1, a.coretype).get("OPENBLAS_CORETYPE", "")}
    log(f"machine: {res['machine']['cpu']}, load {res['machine']['loadavg_start']}")
    log("case 1: kernels vs sgemm")
    res["kernels"] = case_kernels(a)  # case 2 needs its FLOP counts and sgemm peak
    if "2" in cases:
        res["step"] = case_step(a, res["kernels"])
    run_rt_cases(a, res, cases)
    res["loadavg_end"] = loadavg()
    res["seconds"] = time.time() - t0
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, a.name + ".json"), "w") as f:
        json.dump(res, f, indent=1)
    md = markdown(res)
    with open(os.path.join(a.out, a.name + ".md"), "w") as f:
        f.write(md)
    print(md)
    log(f"done in {res['seconds']:.0f} s: {a.out}/{a.name}.json, {a.name}.md")


if __name__ == "__main__":
    main()

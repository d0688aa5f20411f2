"""harness: runs the cases of bench/run.sh and writes bench/results/latest.{json,md}.

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

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PY = "/usr/bin/python3"

KERNEL_JOBS = ["examples/jobs/gpt-tiny.json", "examples/jobs/llama-tiny.json",
               "bench/jobs/gpt-d256.json", "bench/jobs/gpt-d512.json"]
STEP_JOBS = ["bench/jobs/gpt-d256.json", "bench/jobs/gpt-d512.json"]

# Targets of issue 8.
TARGET_STEP_RATIO = 1.25
TARGET_STEP_PEAK = 0.85


def log(msg):
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def loadavg():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


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


def env_for(threads, coretype, passive=False):
    e = dict(os.environ)
    e["OPENBLAS_NUM_THREADS"] = str(threads)
    e["OMP_NUM_THREADS"] = str(threads)
    if passive:
        e["OMP_WAIT_POLICY"] = "PASSIVE"
    if coretype == "auto":  # OpenBLAS detects the CPU itself
        e.pop("OPENBLAS_CORETYPE", None)
    elif coretype:
        e["OPENBLAS_CORETYPE"] = coretype
    return e  # else: the environment's own choice, as everything else here runs


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

class Server:
    """A process speaking bench_step's protocol: "ready", then one JSON line
    per "step" command."""

    def __init__(self, cmd, env):
        self.p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        line = self.p.stdout.readline()
        if line.strip() != "ready":
            self.p.kill()
            raise SystemExit(f"{cmd[0]}: did not start ({line!r})")

    def cmd(self, what):
        self.p.stdin.write(what + "\n")
        self.p.stdin.flush()
        line = self.p.stdout.readline()
        if not line:
            raise SystemExit("a step server died")
        return json.loads(line)

    def step(self):
        return self.cmd("step")["ms"]

    def close(self):
        try:
            self.p.stdin.write("quit\n")
            self.p.stdin.close()
        except OSError:
            pass
        self.p.wait(timeout=120)


def interleaved_steps(a, job, threads, warmup, steps, probe):
    """pipewright and PyTorch, both resident, alternate single training steps
    A B B A A B ... (each idle while the other computes); with probe, the
    bare sgemms of one step's linear layers run between them (A S B B S A).
    Returns the timed per-step ms of each side and the probe's
    [(ms, gflop)], in order."""
    pw = Server([os.path.join(a.build, "bench", "bench_step"), "--job", job, "--threads",
                 str(threads)], env_for(threads, a.coretype))
    th = Server([PY, os.path.join(HERE, "torch_step.py"), "--job", job, "--serve", "--threads",
                 str(threads)], env_for(threads, a.coretype, passive=threads > 1))
    try:
        for _ in range(warmup):
            pw.step()
            th.step()
        p, t, g = [], [], []
        for i in range(steps):
            first, second = (pw, th) if i % 2 == 0 else (th, pw)
            (p if first is pw else t).append(first.step())
            if probe:
                r = pw.cmd("sgemm")
                g.append((r["ms"], r["gflop"]))
            (p if second is pw else t).append(second.step())
    finally:
        pw.close()
        th.close()
    return p, t, g


def case_step(a, kernels):
    flops = {j["job"]: j for j in kernels["jobs"]}
    rows = []
    for job in STEP_JOBS:
        kj = flops[job]
        big = kj["d_model"] >= 512
        W = 1 if big else 2
        K = (4 if big else 12) if a.quick else (12 if big else 40)
        tokens = kj["batch_size"] * kj["seq_len"]
        for threads in (1, 2):
            la0 = loadavg()
            log(f"case 2: {kj['name']}, {threads} thread(s): {W} + {K} steps each, alternating")
            p, t, g = interleaved_steps(a, job, threads, W, K, probe=threads == 1)
            pw_ms, th_ms = statistics.median(p), statistics.median(t)
            gf = kj["flops_per_step"]["total"]
            # sgemm peak: the bare sgemms of the step's linear layers, timed
            # between the steps (one thread); case 1's figure otherwise
            peak = g[0][1] / (statistics.median(x[0] for x in g) * 1e-3) if g else kj["sgemm_gflops_linear_shapes"]
            rows.append({
                "job": job, "name": kj["name"], "threads": threads,
                "warmup": W, "steps": K,
                "pipewright_ms": pw_ms, "torch_ms": th_ms,
                "pipewright_tokens_per_s": tokens / pw_ms * 1e3,
                "torch_tokens_per_s": tokens / th_ms * 1e3,
                "ratio": th_ms / pw_ms,  # pipewright tokens/s over PyTorch's
                # from each side's fastest step: the least disturbed by other load
                "ratio_best": min(t) / min(p),
                # median over adjacent pairs (steps i of both sides): robust to drifting load
                "ratio_paired": statistics.median(x / y for x, y in zip(t, p)),
                "pipewright_steps_ms": p, "torch_steps_ms": t, "sgemm_probe_ms": [x[0] for x in g],
                "model_gflop_per_step": gf * 1e-9,
                "sgemm_gflops": peak,
                # fraction of sgemm peak for the step as a whole (one thread only:
                # the peak was measured on one thread)
                "pipewright_peak_fraction": gf / (pw_ms * 1e-3) * 1e-9 / peak if threads == 1 else None,
                "torch_peak_fraction": gf / (th_ms * 1e-3) * 1e-9 / peak if threads == 1 else None,
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
        la0 = loadavg()
        try:
            res[key] = fn(*args)
        except Exception as e:  # a failed case is reported, the run goes on
            res[key] = {"error": f"{type(e).__name__}: {e}"[:400]}
        if isinstance(res[key], dict):
            res[key]["loadavg"] = [la0, loadavg()]

    if "2" in cases:
        log("case 2: d256 GPT as a pp = 2 pipeline of two 1-thread workers")
        guard("pp2_step", cases_rt.case_pp2_step, a, env)
    if "3" in cases or "6" in cases:
        log("case 3/6: pipeline efficiency and memory, pp = 2, 4, four schedules")
        guard("pipeline", cases_rt.case_pipeline, a, env)
    wake = None
    if "4" in cases or "5" in cases:
        try:
            wake = cases_rt.case_wake(a)
        except Exception as e:
            log(f"wake-up bench failed: {e}")
        res["wake_us"] = wake
    if "4" in cases:
        log("case 4: runtime overhead (2 layers, d = 64, batch 2)")
        guard("overhead", cases_rt.case_overhead, a, env, wake or {"hot_us": 0.0, "idle_us": 0.0})
    if "5" in cases:
        log("case 5: transport vs raw socket stream")
        guard("transport", cases_rt.case_transport, a)
    if "7" in cases:
        log("case 7: control plane (wrk)")
        guard("control", cases_rt.case_control, a)
    import shutil
    shutil.rmtree(a.scratch, ignore_errors=True)


def yn(ok):
    return "met" if ok else "**missed**"


def targets_md(res):
    """One line per target of issue 8: met / missed, with the figure."""
    T = []
    for r in res.get("step", []):
        if r["threads"] == 1:
            T.append((f"step ≥ 1.25× PyTorch, 1 thread, {r['name']}", f"{r['ratio']:.2f}×", r["ratio"] >= 1.25))
    p = res.get("pipeline")
    for r in (p or {}).get("rows", []) if p and "error" not in p else []:
        if r["pp"] == 2 and r["schedule"] in ("1f1b", "zb-h1") and "error" not in r:
            T.append((f"pipeline efficiency ≥ 0.9, pp = 2, m = 8, {r['schedule']}", f"{r['efficiency']:.2f}",
                      r["efficiency"] >= 0.9))
    o = res.get("overhead")
    if o and "error" not in o:
        T.append(("overhead ≤ 20 µs/step at pp = 1", f"{o['pp1']['overhead_us_per_step']:.0f} µs",
                  o["pp1"]["overhead_us_per_step"] <= 20))
        for pp in (1, 2):
            x = o[f"pp{pp}"]
            T.append((f"overhead ≤ 5 µs/action above the wake-up cost, pp = {pp}",
                      f"{x['over_wake_us_per_action']:.0f} µs", x["over_wake_us_per_action"] <= 5))
    runs = ([res["pp2_step"]] if res.get("pp2_step") and "error" not in res["pp2_step"] else []) + \
        ([r for r in p["rows"] if "error" not in r] if p and "error" not in p else [])
    if runs:
        bad = [(r, m) for r in runs for m in r["memory"]
               if not (m["minflt_per_step"] == 0 and m["rss_growth_per_step"] <= 0 and m["vmdata_growth_per_step"] <= 0)]
        T.append(("no page faults / heap growth per step in steady state",
                  f"{len(bad)} of {sum(len(r['memory']) for r in runs)} ranks with any", not bad))
    tr = res.get("transport")
    if tr and "error" not in tr:
        worst = min(tr["rows"], key=lambda r: r["ratio"])
        T.append(("transport ≥ 0.8 of the raw socket stream (worst size/mode)",
                  f"{worst['ratio']:.2f} ({worst['size'] >> 10} KiB {worst['mode']})", worst["ratio"] >= 0.8))
    c = res.get("control")
    if c and "error" not in c:
        w = c["jobs"]
        T.append(("GET /v1/jobs/{id} ≥ 5000 req/s, p99 < 5 ms, 0 errors",
                  f"{fmt(w['rps'], 0)} req/s, p99 {fmt(w['p99_ms'], 2)} ms, {w['errors']} errors",
                  (w["rps"] or 0) >= 5000 and (w["p99_ms"] or 1e9) < 5 and w["errors"] == 0))
    L = ["## Targets (issue 8)\n", "| target | measured | |", "|---|---|---|"]
    L += [f"| {t} | {v} | {yn(ok)} |" for t, v, ok in T]
    L.append("\nWhere targets are missed, bench/README.md (Notes) says where the time goes.\n")
    return L


def cases_rt_md(res):
    L = []
    p = res.get("pipeline")
    if p:
        L.append("## Case 3: pipeline efficiency (GPT d=128, 8 layers, T=64, B=16, m = 8; 1-thread workers sharing "
                 f"{res['machine']['cores']} cores)\n")
        if "error" in p:
            L.append(f"failed: {p['error']}\n")
        else:
            L.append(f"Single rank (pp = 1, same job, through the worker): {p['single_rank_period_s'] * 1e3:.1f} ms/step "
                     f"(median of {p.get('rounds', 1)} rounds; each configuration's row is its round with the median "
                     "efficiency, the rounds' efficiencies in the last column). "
                     "Ideal = single-rank tokens/s × min(pp, cores) × (1 − bubble of the plan replayed with the "
                     "measured per-action costs, zero transfer cost); efficiency = measured ÷ ideal. Measured bubble: "
                     "1 − Σ action time ÷ (pp × last action end) on the traced steps. Planned: the planner's FLOP-model "
                     "bubble. At pp = 4 four workers share two cores, so per-action costs are inflated by sharing and "
                     "the ideal is not tight.\n")
            L.append("| pp | schedule | V | ms/step | tok/s | ideal tok/s | efficiency | target | bubble: measured "
                     "| replayed (measured costs) | planned | efficiency of each round |")
            L.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
            for r in p["rows"]:
                if "error" in r:
                    L.append(f"| {r['pp']} | {r['schedule']} | {r['V']} | failed: {r['error']} | | | | | | | | |")
                    continue
                tgt = "≥ 0.9: " + yn(r["efficiency"] >= 0.9) if r["pp"] == 2 and r["schedule"] in ("1f1b", "zb-h1") else "-"
                L.append(f"| {r['pp']} | {r['schedule']} | {r['V']} | {r['step_period_s'] * 1e3:.1f} | {r['tokens_per_s']:.0f} "
                         f"| {r['ideal_tokens_per_s']:.0f} | {r['efficiency']:.2f} | {tgt} | {r['measured_bubble']:.3f} "
                         f"| {r['replay_bubble']:.3f} | {r['planned_bubble']:.3f} | "
                         + " ".join(f"{e:.2f}" for e in r.get("efficiency_rounds", [])) + " |")
            L.append("")
    o = res.get("overhead")
    if o:
        L.append("## Case 4: runtime overhead (GPT 2 layers, d=64, T=64, batch 2, m = 1)\n")
        if "error" in o:
            L.append(f"failed: {o['error']}\n")
        else:
            L.append(f"In-process step (`pipewright train`, median): {o['inproc_step_s'] * 1e6:.0f} µs. Blocking "
                     f"wake-up between processes: {o['wake_us']:.1f} µs for a process blocked 1 ms (its CPU idle, "
                     f"as a worker's threads are between actions; `bench_transport wakeidle`), "
                     f"{o['wake_hot_us']:.1f} µs in a hot pipe ping-pong; the first is the wake-up cost used below. "
                     "Overhead = worker step time (median, from the workers' own step reports) − in-process step. "
                     "SpectraX reports ≈ 150 µs per step on this case.\n")
            L.append("| pp | worker µs/step | overhead µs/step | actions | µs/action | µs/action above one wake-up | target |")
            L.append("|---|---|---|---|---|---|---|")
            for pp in (1, 2):
                x = o[f"pp{pp}"]
                tgt = (f"≤ 20 µs/step: {yn(x['overhead_us_per_step'] <= 20)}; " if pp == 1 else "") + \
                    f"≤ 5 µs/action above wake-up: {yn(x['over_wake_us_per_action'] <= 5)}"
                L.append(f"| {pp} | {x['worker_step_s'] * 1e6:.0f} | {x['overhead_us_per_step']:.0f} | {x['actions']} "
                         f"| {x['overhead_us_per_action']:.1f} | {x['over_wake_us_per_action']:.1f} | {tgt} |")
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
        L.append("## Case 5: transport, pipewright frames vs a raw socket stream (loopback TCP, two processes)\n")
        if "error" in tr:
            L.append(f"failed: {tr['error']}\n")
        else:
            L.append("`bench_transport` (C): pw = what a worker's compute thread does (PWF1 header with the payload's "
                     "crc32c, header + payload in one non-blocking sendmsg, waiting for the socket only for the rest; "
                     "receiver: non-blocking reads through pw_frame_reader straight into a destination buffer, CRC "
                     "checked, yielding the core for up to 1 ms while nothing comes, then poll()); raw = blocking "
                     "write()/read() of the same bytes, no checks. "
                     "pingpong: a 1-byte answer after every message (time = one hop + a tiny return); stream: back to "
                     "back. Interleaved A B B A, medians. "
                     f"Latency per hop (0-byte payload, half round trip): pw {tr['hop_latency_us_pw']:.1f} µs, "
                     f"raw {tr['hop_latency_us_raw']:.1f} µs.\n")
            L.append("| size | mode | pw µs/msg | raw µs/msg | pw GB/s | raw GB/s | ratio (target ≥ 0.8) |")
            L.append("|---|---|---|---|---|---|---|")
            for r in tr["rows"]:
                sz = f"{r['size'] >> 10} KiB" if r["size"] < (1 << 20) else f"{r['size'] >> 20} MiB"
                L.append(f"| {sz} | {r['mode']} | {r['pw_us']:.0f} | {r['raw_us']:.0f} | {r['pw_gbytes_per_s']:.2f} "
                         f"| {r['raw_gbytes_per_s']:.2f} | {r['ratio']:.2f} {yn(r['ratio'] >= 0.8)} |")
            L.append("")
    if p and "error" not in p or res.get("pp2_step"):
        L.append("## Case 6: steady-state memory per rank (after a third of the steps, at least 2, as warm-up)\n")
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
        runs = ([res["pp2_step"]] if res.get("pp2_step") and "error" not in res["pp2_step"] else []) + \
            ([r for r in p["rows"] if "error" not in r] if p and "error" not in p else [])
        for r in runs:
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
             " and reported as a median)\n")

    L.extend(targets_md(res))
    if "step" in res:
        L.append("## Case 2: training step vs PyTorch (float32, AdamW, clipping)\n")
        L.append("| model | threads | pipewright ms/step | PyTorch ms/step | pipewright tok/s | PyTorch tok/s "
                 "| ratio (target ≥ 1.25) | ratio of best steps | paired ratio | pipewright % of sgemm peak (target ≥ 85) "
                 "| PyTorch % of peak | load |")
        L.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for r in res["step"]:
            ok = "met" if r["ratio"] >= TARGET_STEP_RATIO else "**missed**"
            pk = r["pipewright_peak_fraction"]
            pk_s = "-" if pk is None else f"{100 * pk:.1f} " + ("(met)" if pk >= TARGET_STEP_PEAK else "(**missed**)")
            tp = r["torch_peak_fraction"]
            thr = str(r["threads"])
            L.append(f"| {r['name']} | {thr} | {r['pipewright_ms']:.1f} | {r['torch_ms']:.1f} "
                     f"| {r['pipewright_tokens_per_s']:.0f} | {r['torch_tokens_per_s']:.0f} "
                     f"| {r['ratio']:.2f}× " + (ok if r["threads"] == 1 else "") +
                     f" | {r['ratio_best']:.2f}× | {r['ratio_paired']:.2f}× | {pk_s} | {'-' if tp is None else f'{100 * tp:.1f}'} "
                     f"| {r['loadavg'][0]:.1f}–{r['loadavg'][1]:.1f} |")
        pp2 = res.get("pp2_step")
        if pp2 and "error" not in pp2:
            th2 = next((r for r in res["step"] if r["name"] == pp2["name"] and r["threads"] == 2), None)
            tt = th2["torch_tokens_per_s"] if th2 else None
            L.append(f"| {pp2['name']} | 2 (pp = 2 {pp2['schedule']}, m = {pp2['m']}, two 1-thread workers) "
                     f"| {pp2['step_period_s'] * 1e3:.1f} | {th2['torch_ms'] if th2 else float('nan'):.1f} "
                     f"| {pp2['tokens_per_s']:.0f} | {fmt(tt, 0)} | {pp2['tokens_per_s'] / tt if tt else float('nan'):.2f}× "
                     "| - | - | - | - | - |")
        elif pp2:
            L.append(f"| bench-gpt-d256 | 2 (pp = 2) | failed: {pp2['error']} | | | | | | | | | |")
        L.append("")
        L.append("Both trainers stay resident and alternate single steps (A B B A ..., each idle while the "
                 "other computes); ms/step is the median over the timed steps, after warm-up steps. Ratio = pipewright "
                 "tokens/s ÷ PyTorch tokens/s (of the medians; paired: the median of the ratios of adjacent steps). Model FLOPs "
                 "per step count the linear layers (6·N·C·OC) and attention as PyTorch computes it "
                 "(12·B·T²·C per layer, the masked half included); sgemm peak: the bare `cblas_sgemm` calls of the "
                 "step's linear layers (all three directions), one thread, timed between the steps of the same "
                 "run (its median). Two-thread rows: "
                 "pipewright as one process with OpenBLAS on 2 threads (its other kernels run on one), PyTorch "
                 "with 2 threads and OMP_WAIT_POLICY=PASSIVE; the 2 cores are shared with other processes, so "
                 "these are the noisiest figures. The pp = 2 row: the d256 GPT as a pipeline of two 1-thread "
                 "pipewright-worker processes (bench/pipe.py plays the coordinator), ms/step = median wall time "
                 "between consecutive steps; it is compared with the PyTorch 2-thread figure of the same run "
                 "(measured earlier in the run, not interleaved with the pipeline).\n")
    L.extend(cases_rt_md(res))

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
    ap.add_argument("--build", required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--name", default="latest", help="result file stem (default latest)")
    ap.add_argument("--coretype", default="",
                    help="OPENBLAS_CORETYPE for both sides: a core name, or auto (unset: OpenBLAS detects "
                         "the CPU); default: as the environment has it")
    ap.add_argument("--cases", default="1,2,3,4,5,6,7", help="1 (kernels) always runs: case 2 needs its figures")
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

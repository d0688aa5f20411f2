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
# Placeholders for the parts that do not exist yet.

PENDING = [
    ("2", "Training step, pp = 2 pipeline of two 1-thread workers",
     "needs the worker daemon (pipewright-worker), which the harness does not drive yet"),
    ("3", "Pipeline efficiency (pp = 2, 4; 1f1b, zb-h1, interleaved-1f1b, dualpipev)",
     "needs the worker daemon and the coordinator, which the harness does not drive yet"),
    ("4", "Runtime overhead per step and per action (2-layer, d = 64, batch 2)",
     "needs the worker daemon, which the harness does not drive yet"),
    ("5", "Transport: activation transfer vs raw socket stream (64 KiB, 1 MiB, 16 MiB)",
     "needs the worker daemon's transport, which the harness does not drive yet"),
    ("6", "Steady-state memory: page faults and heap growth per step, peak RSS vs plan",
     "needs the worker daemon, which the harness does not drive yet"),
    ("7", "Control plane: wrk against GET /v1/jobs/{id} and GET /metrics",
     "needs the coordinator's HTTP API, which the harness does not drive yet"),
]


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
        L.append("| gpt d256, d512 | 2 | not yet measured: needs the worker daemon (pp = 2 pipeline of two "
                 "1-thread workers), which the harness does not drive yet | | | | | | | | | |")
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
                 "these are the noisiest figures.\n")

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

    L.append("## Not yet measured\n")
    L.append("| case | what | why |")
    L.append("|---|---|---|")
    for c, what, why in PENDING:
        L.append(f"| {c} | {what} | not yet measured: {why} |")
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
    ap.add_argument("--cases", default="1,2", help="1 (kernels) always runs: case 2 needs its figures")
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
    res["pending"] = [{"case": c, "what": w, "status": "not yet measured: " + why} for c, w, why in PENDING]
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

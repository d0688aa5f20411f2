"""torch_versions: pipewright's training step against PyTorch 2.x (PyPI) and
PyTorch 1.13 (Debian's python3-torch) in one run, per core (issue 36).

    bench/torch2_venv.sh          # once: .venv-torch2 with PyTorch 2.x
    /usr/bin/python3 bench/torch_versions.py [--build DIR] [--models d256,d512]
                     [--rounds 9] [--warmup 2] [--bf16-models d256] [--bf16-rounds 3]

For each bench GPT (bench/jobs/gpt-<model>.json) resident step servers
(bench_step and torch_step.py --serve, bench_step's protocol) take one step
each per round, in an order that rotates every round, so that load from
other processes hits all of them alike; one thread each:
  pw-fp32           pipewright float32, OPENBLAS_CORETYPE unset (OpenBLAS's
                    own pick for this CPU); a second server pw-fp32-haswell
                    with OPENBLAS_CORETYPE=Haswell (what CI's machines force)
                    only when OpenBLAS picks another kernel unset
  torch1.13-fp32    Debian's PyTorch (/usr/bin/python3), float32, foreach AdamW
  torch2-fp32       PyTorch 2.x from the venv (PW_BENCH_PYTHON, else
                    .venv-torch2/bin/python3), float32, foreach AdamW
and, for the --bf16-models, in the first --bf16-rounds rounds after one
warm-up step (a bf16 step on a CPU without AVX512_BF16 or AMX can take
tens of seconds):
  torch1.13-bf16, torch2-bf16   forward and loss under torch.autocast("cpu", torch.bfloat16)
  pw-bf16           pipewright train.precision "bf16"
A ratio is the median of the per-round ratios (PyTorch's ms over
pipewright's: > 1, pipewright is faster) with their min-max; "PyTorch at
its best" takes, round by round, the faster of its float32 and bf16 steps
where both ran. The load average is printed before and after and sampled
every round. Writes bench/results/torch/versions.{json,md}.
"""
import argparse
import atexit
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from benchlib import Server, env_for, loadavg, log  # noqa: E402

TORCH2_DEFAULT = os.path.join(ROOT, ".venv-torch2", "bin", "python3")


def openblas_core(coretype):
    """The kernel set Debian's OpenBLAS picks with OPENBLAS_CORETYPE as given
    ("auto": unset), asked of the library in a child process."""
    code = ("import ctypes; l = ctypes.CDLL('libopenblas.so.0'); "
            "l.openblas_get_corename.restype = ctypes.c_char_p; print(l.openblas_get_corename().decode())")
    r = subprocess.run([sys.executable, "-c", code], env=env_for(1, coretype), capture_output=True, text=True)
    return r.stdout.strip() or "?"


def torch_info(py):
    code = ("import json, re, torch; s = torch.__config__.show(); "
            "cap = re.search(r'CPU capability usage: (\\S+)', s); blas = re.search(r'BLAS_INFO=(\\w+)', s); "
            "dnnl = re.search(r'(MKL-DNN|oneDNN) v(\\S+)', s); "
            "print(json.dumps({'version': torch.__version__, 'cpu_capability': cap and cap.group(1), "
            "'blas': blas and blas.group(1), 'onednn': dnnl and dnnl.group(2)}))")
    r = subprocess.run([py, "-c", code], env=env_for(1, "auto"), capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{py}: cannot import torch: {r.stderr.strip()[-400:]}")
    return json.loads(r.stdout)


def cpu_line():
    model, flags = "?", set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name") and model == "?":
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    isa = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    return f"{model}, {os.cpu_count()} CPUs, {' '.join(isa)}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build-bench"))
    ap.add_argument("--models", default="d256,d512")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--bf16-models", default="d256", help="models whose bf16 variants run ('' for none)")
    ap.add_argument("--bf16-rounds", type=int, default=3)
    ap.add_argument("--torch1", default="/usr/bin/python3", help="python with PyTorch 1.13")
    ap.add_argument("--torch2", default=os.environ.get("PW_BENCH_PYTHON", TORCH2_DEFAULT),
                    help="python with PyTorch 2.x (bench/torch2_venv.sh)")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "torch", "versions"))
    a = ap.parse_args()

    pys = {"torch1.13": a.torch1, "torch2": a.torch2}
    tinfo = {k: torch_info(py) for k, py in pys.items()}
    if not tinfo["torch2"]["version"].startswith("2."):
        raise SystemExit(f"{a.torch2}: torch {tinfo['torch2']['version']}, not 2.x (run bench/torch2_venv.sh)")
    cores = {"auto": openblas_core("auto"), "Haswell": openblas_core("Haswell")}
    env_ct = os.environ.get("OPENBLAS_CORETYPE", "")
    step_bin = os.path.join(a.build, "bench", "bench_step")
    ver = subprocess.run([os.path.join(a.build, "pipewright"), "--version"], capture_output=True, text=True).stdout.strip()
    commit = ""
    for p in (os.path.join(a.build, "src", ".commit"),):
        if os.path.exists(p):
            commit = open(p).read().strip()
    if not commit:
        commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    tmp = tempfile.mkdtemp(prefix="pw-torch-versions-")
    atexit.register(shutil.rmtree, tmp, True)
    bf16_models = [m for m in a.bf16_models.split(",") if m]

    res = {"date": time.strftime("%Y-%m-%d %H:%M"), "cpu": cpu_line(), "os": platform.platform(),
           "pipewright": ver, "commit": commit, "torch": tinfo, "openblas_core": cores,
           "openblas_coretype_env": env_ct, "rounds": a.rounds, "warmup": a.warmup,
           "bf16_rounds": a.bf16_rounds, "threads": 1, "models": {}}
    log(f"{res['cpu']}; pipewright {ver} ({commit}); torch {tinfo['torch1.13']['version']} and "
        f"{tinfo['torch2']['version']}; OpenBLAS unset: {cores['auto']}, forced Haswell: {cores['Haswell']}")
    la_start = loadavg()
    for model in a.models.split(","):
        job = os.path.join(HERE, "jobs", f"gpt-{model}.json")
        spec = json.load(open(job))
        spec["data"]["path"] = os.path.join(ROOT, spec["data"]["path"])
        spec["train"]["precision"] = "bf16"
        job_bf16 = os.path.join(tmp, f"{model}-bf16.json")
        json.dump(spec, open(job_bf16, "w"))
        cmds = {"pw-fp32": ([step_bin, "--job", job, "--threads", "1"], env_for(1, "auto"))}
        if cores["Haswell"] != cores["auto"]:
            cmds["pw-fp32-haswell"] = ([step_bin, "--job", job, "--threads", "1"], env_for(1, "Haswell"))
        for k, py in pys.items():
            cmds[f"{k}-fp32"] = ([py, os.path.join(HERE, "torch_step.py"), "--job", job, "--serve", "--foreach",
                                  "--threads", "1"], env_for(1, "auto"))
        bf16 = []
        if model in bf16_models:
            for k, py in pys.items():
                cmds[f"{k}-bf16"] = (cmds[f"{k}-fp32"][0] + ["--autocast"], env_for(1, "auto"))
                bf16.append(f"{k}-bf16")
            cmds["pw-bf16"] = ([step_bin, "--job", job_bf16, "--threads", "1"], env_for(1, "auto"))
            bf16.append("pw-bf16")
        la0 = loadavg()
        log(f"{model}: starting {len(cmds)} step servers; load average {la0}")
        servers = {}
        try:
            for k, (c, e) in cmds.items():
                servers[k] = Server(c, e)
            names = list(servers)
            ms = {k: [None] * a.rounds for k in names}
            loss = {}
            for k in bf16:  # one warm-up step each: oneDNN's first calls
                loss[k] = servers[k].cmd("step")["loss"]
            la_rounds = []
            for r in range(a.warmup + a.rounds):
                order = names[r % len(names):] + names[:r % len(names)]
                t = r - a.warmup
                for k in order:
                    if k in bf16 and not 0 <= t < a.bf16_rounds:
                        continue
                    out = servers[k].cmd("step")
                    loss[k] = out["loss"]
                    if t >= 0:
                        ms[k][t] = out["ms"]
                la_rounds.append(loadavg())
                if t >= 0:
                    log(f"{model} round {t + 1}: " + ", ".join(f"{k} {ms[k][t]:.0f}" for k in names if ms[k][t]) +
                        f" ms; load {la_rounds[-1]}")
        finally:
            for s in servers.values():
                s.close()
        la1 = loadavg()

        def ratio(slow, fast):
            """Per round slow's ms over fast's, where both ran: median, min-max."""
            r = [x / y for x, y in zip(ms[slow], ms[fast]) if x and y]
            if not r:
                return None
            return {"median": statistics.median(r), "min": min(r), "max": max(r), "n": len(r)}

        med = {k: {"median": statistics.median(v), "min": min(v), "max": max(v), "n": len(v)}
               for k, v in ((k, [x for x in ms[k] if x]) for k in names) if v}
        ratios = {}
        for k in ("torch1.13", "torch2"):
            ratios[f"{k}-fp32 / pw-fp32"] = ratio(f"{k}-fp32", "pw-fp32")
            if f"{k}-bf16" in ms:
                ratios[f"{k}-bf16 / pw-fp32"] = ratio(f"{k}-bf16", "pw-fp32")
                ratios[f"{k}-bf16 / {k}-fp32"] = ratio(f"{k}-bf16", f"{k}-fp32")
                best = [min(x, y) if y else x for x, y in zip(ms[f"{k}-fp32"], ms[f"{k}-bf16"])]
                ms[f"{k}-best"] = best
                ratios[f"{k}-best / pw-fp32"] = ratio(f"{k}-best", "pw-fp32")
        ratios["torch1.13-fp32 / torch2-fp32"] = ratio("torch1.13-fp32", "torch2-fp32")
        if "pw-fp32-haswell" in ms:
            ratios["pw-fp32-haswell / pw-fp32"] = ratio("pw-fp32-haswell", "pw-fp32")
        if "pw-bf16" in ms:
            ratios["pw-bf16 / pw-fp32"] = ratio("pw-bf16", "pw-fp32")
        res["models"][model] = {"job": os.path.relpath(job, ROOT), "step_ms": ms, "summary_ms": med,
                                "ratios": {k: v for k, v in ratios.items() if v},
                                "loss_last": loss, "load_before": la0, "load_after": la1,
                                "load_rounds": la_rounds}
    res["load_start"], res["load_end"] = la_start, loadavg()
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out + ".json", "w") as f:
        json.dump(res, f, indent=1)
    md = render(res)
    with open(a.out + ".md", "w") as f:
        f.write(md)
    print(md)


def fmt(q, unit=""):
    return f"{q['median']:.0f}{unit} ({q['min']:.0f}–{q['max']:.0f})" if q else "–"


def fr(q):
    return f"**{q['median']:.2f}×** ({q['min']:.2f}–{q['max']:.2f})" if q else "–"


def render(res):
    t1, t2 = res["torch"]["torch1.13"], res["torch"]["torch2"]
    L = [f"# pipewright against PyTorch {t2['version']} and {t1['version']}, one thread each", "",
         f"{res['date']}; {res['cpu']}; {res['os']}.",
         f"pipewright {res['pipewright']} ({res['commit']}), Release build; OpenBLAS's kernel with "
         f"OPENBLAS_CORETYPE unset: {res['openblas_core']['auto']} (forced Haswell: "
         f"{res['openblas_core']['Haswell']}); OPENBLAS_CORETYPE in the environment: "
         f"{res['openblas_coretype_env'] or '(unset)'}.",
         f"PyTorch {t2['version']} (PyPI, bench/torch2_venv.sh): BLAS {t2['blas']}, oneDNN {t2['onednn']}, "
         f"CPU capability {t2['cpu_capability']}; PyTorch {t1['version']} (Debian): BLAS {t1['blas']} "
         f"(OpenBLAS), oneDNN {t1['onednn']}, CPU capability {t1['cpu_capability']}. Both: foreach AdamW, "
         "torch.set_num_threads(1).",
         f"{res['rounds']} rounds after {res['warmup']} warm-up, servers resident, order rotating every round; "
         f"bf16 variants in the first {res['bf16_rounds']} rounds after one warm-up step. "
         f"Load average {res['load_start']} at the start, {res['load_end']} at the end (2 CPUs).", ""]
    for model, m in res["models"].items():
        lr = m["load_rounds"]
        L += [f"## {model} ({m['job']})", "",
              f"Load average {m['load_before']} before, {m['load_after']} after; per round "
              f"{min(lr):.1f}–{max(lr):.1f}.", "",
              "| variant | ms per step, median (min–max) | steps | loss after the last step |", "|---|---|---|---|"]
        for k, q in m["summary_ms"].items():
            if k.endswith("-best"):
                continue
            L.append(f"| {k} | {fmt(q)} | {q['n']} | {m['loss_last'].get(k, float('nan')):.4f} |")
        L += ["", "| A / B: A's ms over B's, per round | median (min–max); > 1: B is faster |", "|---|---|"]
        for k, q in m["ratios"].items():
            L.append(f"| {k} | {fr(q)} |")
        L.append("")
    return "\n".join(L) + "\n"


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""attention: the plain attention (the (B, NH, T, T) probabilities kept for
the backward) against the tiled one (FlashAttention-2: each row's
log-sum-exp kept, the probabilities recomputed), issue 39. Five parts, each
with its own result files:

  crossover  bench_attn (CPU time) at T 2, 4, 6 and 8 head widths, heads
           of 16 to 128: where the plain kernel stops being the faster
           (train.attention auto's rule, T <= 4 HD).
  kernels  bench_attn: forward and backward-input of one d768 layer (12
           heads of 64, one sequence) at T 256, 1024 and 4096, one thread,
           both kernels in the same process, in rounds alternating which
           goes first; per kernel the median of the rounds (min-max), and
           the paired ratio plain / tiled of forward + backward.
  step     the training step of a small GPT (d256, 4 layers, 4 heads of 64,
           T 1024, batch 2, byte vocabulary, AdamW, clipping) with
           train.attention "plain" and "tiled": two resident bench_step
           servers (pipewright train's code path), one thread each, single
           steps alternating A B B A ..., the first step of each untimed;
           the median ms per step (min-max) and the paired ratio.
  memory   the same GPT on one pipewright-worker (pp 1, 4 steps) each way:
           peak RSS (VmHWM at the last step's report) against the plan's
           memory_bytes (pw_plan_mem.total, `pipewright plan --json`); the
           measured drop plain -> tiled against the planned drop (the
           process baseline is outside the plan and the same both ways).
  long     a d768 12-layer GPT (12 heads) at T --long (8192: the issue's
           target) with the tiled attention on one worker for --long-steps
           steps: its peak RSS against the plan's figure, the step time.
           The plain attention's plan is printed beside it (it does not fit
           here: 12 x 12 x T^2 floats of probabilities).

  bench/attention.py [--build build-release] [--parts kernels,crossover,step,memory,long]
                     [--rounds 5] [--steps 10] [--long 8192] [--long-steps 1]

Writes bench/results/attention/<part>.{json,md} and prints the markdown.
Every run records the machine, OPENBLAS_CORETYPE and the load average
(other processes share this machine: figures taken above a load of 0.1 per
core are marked indicative)."""
import argparse, json, os, platform, shutil, statistics, subprocess, sys, tempfile, time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import benchlib  # noqa: E402
import pipe  # noqa: E402

MiB = 2 ** 20
OUT = os.path.join(HERE, "results", "attention")


def machine():
    cpu, flags = "?", ""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name") and cpu == "?":
                cpu = line.split(":", 1)[1].strip()
            if line.startswith("flags") and not flags:
                flags = line
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    isa = "AVX-512" if " avx512f" in flags else "AVX2" if " avx2" in flags else "SSE"
    return {"cpu": cpu, "cores": os.cpu_count(), "isa": isa, "kernel": platform.release(), "commit": commit,
            "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE", "(unset)"),
            "date": time.strftime("%Y-%m-%d %H:%M:%S"), "load_start": benchlib.loadavg()}


def machine_line(m, load_end):
    load = max(m["load_start"], load_end)
    quiet = load <= 0.1 * m["cores"]
    return (f"{m['date']}; {m['cpu']} ({m['isa']}), {m['cores']} cores, Linux {m['kernel']}, commit {m['commit']}, "
            f"OPENBLAS_CORETYPE={m['openblas_coretype']}; load average {m['load_start']:.1f} at the start, "
            f"{load_end:.1f} at the end" + ("" if quiet else ": **indicative** (other processes shared the cores)"))


def med(x):
    return statistics.median(x)


def fmt_ms(x):
    return f"{med(x):.2f} ({min(x):.2f}–{max(x):.2f})"


def write(part, res, md):
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, part + ".json"), "w") as f:
        json.dump(res, f, indent=1)
    with open(os.path.join(OUT, part + ".md"), "w") as f:
        f.write(md)
    print(md)


def gpt(impl, T, d=256, layers=4, heads=4, batch=2, steps=4):
    return {"name": f"attention-{impl}-T{T}",
            "model": {"template": "gpt", "vocab_size": 256, "seq_len": T, "d_model": d, "n_layers": layers,
                      "n_heads": heads, "tie_embeddings": False},
            "mesh": {"pp": 1, "dp": 1, "virtual_stages": 1},
            "schedule": {"name": "1f1b", "microbatches": 1},
            "partition": {"mode": "even"},
            "train": {"steps": steps, "batch_size": batch, "seed": 1, "grad_clip": 1.0, "checkpoint_every": 0,
                      "snapshot_every": 0, "attention": impl,
                      "optimizer": {"name": "adamw", "lr": 3e-4, "warmup_steps": 1, "weight_decay": 0.1}},
            "data": {"kind": "text", "path": os.path.join(ROOT, "examples/data/corpus.txt"),
                     "sampler": "sequential"}}


def save_job(tmp, j):
    path = os.path.join(tmp, j["name"] + ".json")
    with open(path, "w") as f:
        json.dump(j, f)
    return path


# ---- kernels ------------------------------------------------------------------

def kernels(a, env):
    m = machine()
    p = subprocess.run([os.path.join(a.build, "bench", "bench_attn"), "--T", a.kernels, "--C", "768", "--NH", "12",
                        "--rounds", str(a.rounds), "--target", str(a.target)], env=env, capture_output=True,
                       text=True, check=True)
    rows = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    res = {"machine": m, "rows": rows, "load_end": benchlib.loadavg()}
    md = ["# Attention kernels: plain against tiled (issue 39)", "",
          machine_line(m, res["load_end"]), "",
          f"One d768 attention layer (12 heads of 64, one sequence), `bench/bench_attn`, one thread; {a.rounds} "
          "rounds alternating which kernel goes first, each kernel ~"
          f"{a.target} s a round. ms per call (wall): the median of the rounds (min–max). The ratios are plain / "
          "tiled of forward + backward, paired by round (> 1: the tiled one is faster), in wall time and in the "
          "thread's CPU time (which leaves out the time slicing of a shared machine). Memory: what each keeps "
          "between its forward and backward plus its scratch.", "",
          "| T | plain forward | tiled forward | plain backward | tiled backward | plain / tiled (F+B), wall | "
          "CPU time | plain saved + scratch | tiled saved + scratch | tiled vs plain (max rel. diff out, dqkv) |",
          "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ms = {k: [x * 1e3 for x in r[k]] for k in ("plain_f", "tiled_f", "plain_b", "tiled_b")}
        ratio = [(pf + pb) / (tf + tb) for pf, tf, pb, tb in zip(ms["plain_f"], ms["tiled_f"], ms["plain_b"],
                                                                ms["tiled_b"])]
        cpu = [(pf + pb) / (tf + tb) for pf, tf, pb, tb in zip(r["plain_f_cpu"], r["tiled_f_cpu"], r["plain_b_cpu"],
                                                              r["tiled_b_cpu"])]
        r["ratio"], r["ratio_cpu"] = ratio, cpu
        md.append(f"| {r['T']} | {fmt_ms(ms['plain_f'])} | {fmt_ms(ms['tiled_f'])} | {fmt_ms(ms['plain_b'])} | "
                  f"{fmt_ms(ms['tiled_b'])} | **{med(ratio):.3f}** ({min(ratio):.3f}–{max(ratio):.3f}) | "
                  f"**{med(cpu):.3f}** ({min(cpu):.3f}–{max(cpu):.3f}) | "
                  f"{r['plain_bytes'] / MiB:.1f} MiB | {r['tiled_bytes'] / MiB:.2f} MiB | "
                  f"{r['max_diff_out']:.1e}, {r['max_diff_dqkv']:.1e} |")
    write("kernels", res, "\n".join(md) + "\n")


# ---- where the plain kernel stops being the faster: auto's rule ---------------------

def crossover(a, env):
    """Forward + backward, plain / tiled, at T = 2, 4, 6 and 8 head widths for heads of 16 to 128, timed
    by the thread's CPU time: on a shared machine, time slicing left out."""
    m = machine()
    shapes = [(16, 64, 4, 8), (32, 256, 8, 2), (64, 768, 12, 1), (128, 768, 6, 1)]  # HD, C, NH, B
    rows = []
    for hd, c, nh, b in shapes:
        Ts = ",".join(str(k * hd) for k in (2, 4, 6, 8))
        p = subprocess.run([os.path.join(a.build, "bench", "bench_attn"), "--T", Ts, "--C", str(c), "--NH", str(nh),
                            "--B", str(b), "--rounds", str(a.rounds), "--target", "0.2"], env=env,
                           capture_output=True, text=True, check=True)
        for line in p.stdout.splitlines():
            if line.startswith("{"):
                r = json.loads(line)
                r["HD"] = hd
                r["ratio"] = [(pf + pb) / (tf + tb) for pf, tf, pb, tb in
                              zip(r["plain_f_cpu"], r["tiled_f_cpu"], r["plain_b_cpu"], r["tiled_b_cpu"])]
                rows.append(r)
    res = {"machine": m, "rows": rows, "load_end": benchlib.loadavg()}
    md = ["# Where the plain attention stops being the faster (issue 39: train.attention auto)", "",
          machine_line(m, res["load_end"]), "",
          f"`bench_attn`, the thread's CPU time, one thread, {a.rounds} rounds alternating the order: "
          "forward + backward of one attention layer, plain / tiled paired by round, median (min–max); > 1: the "
          "tiled kernel is the faster. auto takes the plain one for T ≤ 4 HD.", "",
          "| HD | C, heads, sequences | T = 2 HD | 4 HD | 6 HD | 8 HD |", "|---|---|---|---|---|---|"]
    for hd, c, nh, b in shapes:
        cells = [f"{med(r['ratio']):.2f} ({min(r['ratio']):.2f}–{max(r['ratio']):.2f})" for r in rows if r["HD"] == hd]
        md.append(f"| {hd} | {c}, {nh}, {b} | " + " | ".join(cells) + " |")
    write("crossover", res, "\n".join(md) + "\n")


# ---- a training step ------------------------------------------------------------

def step(a, env, tmp):
    m = machine()
    servers = {}
    for impl in ("plain", "tiled"):
        path = save_job(tmp, gpt(impl, a.step_T, steps=1000))
        servers[impl] = benchlib.Server([os.path.join(a.build, "bench", "bench_step"), "--job", path, "--threads",
                                         "1"], env)
    ms = {"plain": [], "tiled": []}
    try:
        for impl in servers:
            servers[impl].step()  # warm-up: first touch of every buffer
        for i in range(a.steps):
            order = ("plain", "tiled") if i % 2 == 0 else ("tiled", "plain")
            for impl in order:
                ms[impl].append(servers[impl].step())
            benchlib.log(f"step pair {i}: plain {ms['plain'][-1]:.0f} ms, tiled {ms['tiled'][-1]:.0f} ms")
    finally:
        for s in servers.values():
            s.close()
    ratio = [p / t for p, t in zip(ms["plain"], ms["tiled"])]
    res = {"machine": m, "T": a.step_T, "ms": ms, "ratio": ratio, "load_end": benchlib.loadavg()}
    md = ["# A training step: plain against tiled attention (issue 39)", "",
          machine_line(m, res["load_end"]), "",
          f"GPT d256, 4 layers, 4 heads of 64, T {a.step_T}, batch 2 (one microbatch), byte vocabulary, AdamW, "
          "clipping: two resident `bench_step` servers (`pipewright train`'s step), one thread each, "
          f"{a.steps} steps each alternating A B B A after one untimed step each.", "",
          "| train.attention | ms per step: median (min–max) |", "|---|---|",
          f"| plain | {fmt_ms(ms['plain'])} |", f"| tiled | {fmt_ms(ms['tiled'])} |", "",
          f"plain / tiled, paired by step: **{med(ratio):.3f}** (min {min(ratio):.3f}, max {max(ratio):.3f}); "
          "> 1: the tiled step is faster."]
    write("step", res, "\n".join(md) + "\n")


# ---- peak RSS against the plan -----------------------------------------------------

def memory(a, env, tmp):
    m = machine()
    rows = {}
    for impl in ("plain", "tiled"):
        r = pipe.run(a.build, gpt(impl, a.step_T), os.path.join(tmp, f"mem-{impl}"), trace_every=0, env=env,
                     timeout=600)
        rank = r["plan"]["analytics"]["ranks"][0]
        rows[impl] = {"hwm": r["reports"][0][-1]["hwm"], "plan": rank["memory_bytes"], "memory": rank["memory"]}
        benchlib.log(f"memory {impl}: peak RSS {rows[impl]['hwm'] / MiB:.1f} MiB, plan {rank['memory_bytes'] / MiB:.1f}")
    got = rows["plain"]["hwm"] - rows["tiled"]["hwm"]
    want = rows["plain"]["plan"] - rows["tiled"]["plan"]
    res = {"machine": m, "T": a.step_T, "rows": rows, "drop_measured": got, "drop_planned": want,
           "drop_ratio": got / want, "load_end": benchlib.loadavg()}
    md = ["# Peak RSS against the plan: plain and tiled attention (issue 39)", "",
          machine_line(m, res["load_end"]), "",
          f"The step's GPT (d256, 4 layers, 4 heads, T {a.step_T}, batch 2) on one pipewright-worker (pp 1, 4 steps, "
          "snapshots off), each way: VmHWM at the last step's report against the plan's memory_bytes.", "",
          "| train.attention | peak RSS | planned | RSS − planned | planned slots | planned scratch |",
          "|---|---|---|---|---|---|"]
    for impl in ("plain", "tiled"):
        x = rows[impl]
        md.append(f"| {impl} | {x['hwm'] / MiB:.1f} MiB | {x['plan'] / MiB:.1f} MiB | "
                  f"{(x['hwm'] - x['plan']) / MiB:+.1f} MiB | {x['memory']['slots'] / MiB:.1f} MiB | "
                  f"{x['memory']['scratch'] / MiB:.2f} MiB |")
    md += ["", f"Drop plain → tiled: measured {got / MiB:.1f} MiB, planned {want / MiB:.1f} MiB "
           f"(**{got / want:.3f}**; within 5 %: {'yes' if abs(got / want - 1) <= 0.05 else 'no'})."]
    write("memory", res, "\n".join(md) + "\n")


# ---- the long-context target ----------------------------------------------------------

def long_run(a, env, tmp):
    m = machine()
    j = gpt("tiled", a.long, d=768, layers=12, heads=12, batch=1, steps=a.long_steps)
    jp = gpt("plain", a.long, d=768, layers=12, heads=12, batch=1, steps=a.long_steps)
    plain_plan = pipe.plan(a.build, save_job(tmp, jp))["analytics"]["ranks"][0]["memory_bytes"]
    t0 = time.time()
    r = pipe.run(a.build, j, os.path.join(tmp, "long"), trace_every=0, env=env, timeout=a.long_timeout)
    wall = time.time() - t0
    rep = r["reports"][0]
    rank = r["plan"]["analytics"]["ranks"][0]
    hwm, plan = rep[-1]["hwm"], rank["memory_bytes"]
    res = {"machine": m, "T": a.long, "steps": a.long_steps, "hwm": hwm, "plan": plan, "memory": rank["memory"],
           "plain_plan": plain_plan, "step_time": [x.get("step_time") for x in rep],
           "loss": [x.get("loss") for x in rep], "wall": wall, "load_end": benchlib.loadavg()}
    md = ["# The long-context target: GPT d768, 12 layers, T %d, tiled attention (issue 39)" % a.long, "",
          machine_line(m, res["load_end"]), "",
          f"GPT d768, 12 layers, 12 heads, T {a.long}, batch 1, byte vocabulary, AdamW, on one pipewright-worker "
          f"(pp 1, one thread, snapshots off), {a.long_steps} step(s); peak RSS = VmHWM at the last step's report.", "",
          "| | |", "|---|---|",
          f"| peak RSS | {hwm / MiB:.0f} MiB |",
          f"| the plan's memory_bytes | {plan / MiB:.0f} MiB (activation slots {rank['memory']['slots'] / MiB:.0f} MiB, "
          f"scratch {rank['memory']['scratch'] / MiB:.2f} MiB) |",
          f"| peak RSS / plan | **{hwm / plan:.3f}** (within 5 %: {'yes' if abs(hwm / plan - 1) <= 0.05 else 'no'}) |",
          f"| the same job with train.attention \"plain\": the plan's memory_bytes | {plain_plan / MiB:.0f} MiB |",
          f"| step time | {', '.join(f'{s:.1f} s' for s in res['step_time'] if s is not None)} |",
          f"| loss | {', '.join(f'{x:.4f}' for x in res['loss'] if x is not None)} |"]
    write(f"long-T{a.long}", res, "\n".join(md) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build-release"))
    ap.add_argument("--parts", default="kernels,step,memory")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--target", type=float, default=0.3, help="seconds per kernel per round")
    ap.add_argument("--kernels", default="256,1024,4096")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--step-T", type=int, default=1024)
    ap.add_argument("--long", type=int, default=8192)
    ap.add_argument("--long-steps", type=int, default=1)
    ap.add_argument("--long-timeout", type=int, default=3600)
    a = ap.parse_args()
    a.build = os.path.abspath(a.build)
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    tmp = tempfile.mkdtemp(prefix="pw-attention-")
    try:
        for part in a.parts.split(","):
            {"kernels": lambda: kernels(a, env), "crossover": lambda: crossover(a, env), "step": lambda: step(a, env, tmp),
             "memory": lambda: memory(a, env, tmp), "long": lambda: long_run(a, env, tmp)}[part]()
    finally:
        shutil.rmtree(tmp, True)


if __name__ == "__main__":
    main()

"""gemm_path: a training step's time with OpenBLAS's kernel below the CPU
(OPENBLAS_CORETYPE=Prescott, the kernel Debian 12's OpenBLAS falls back to
on a CPU it does not know) against the default, side by side:

    /usr/bin/python3 bench/gemm_path.py [--build build-release] [--job bench/jobs/gpt-d256.json]
                                        [--rounds 7] [--steps 5]

Three bench_step servers (one thread each) train the same job: OpenBLAS's
own kernel (OPENBLAS_CORETYPE as the environment has it), Prescott with
the products on the path gemm.h chooses (oneDNN), and Prescott forced onto
OpenBLAS (PW_GEMM=openblas: what pipewright did before). Each round runs a
step on each in rotating order, `--steps` times; the median step of each,
its rounds' range, and the ratios to the default. Writes
bench/results/dispatch/gemm-path.{json,md}."""
import argparse, json, os, statistics, subprocess, sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


class Server:
    def __init__(self, build, job, env):
        self.p = subprocess.Popen([os.path.join(build, "bench", "bench_step"), "--job", job, "--threads", "1"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
        line = self.p.stdout.readline().strip()
        if line != "ready":
            sys.exit(f"bench_step did not start: {line!r}")

    def step(self):
        self.p.stdin.write("step\n")
        self.p.stdin.flush()
        return json.loads(self.p.stdout.readline())["ms"]

    def close(self):
        self.p.stdin.write("quit\n")
        self.p.stdin.flush()
        self.p.wait(timeout=60)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build-release"))
    ap.add_argument("--job", default=os.path.join(HERE, "jobs", "gpt-d256.json"))
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--against", choices=["prescott", "skylakex"], default="prescott",
                    help="skylakex: nothing set (the default, OPENBLAS_CORETYPE removed) against "
                         "OPENBLAS_CORETYPE=SkylakeX, on an AVX-512 server (issue 36's 80 %% check)")
    a = ap.parse_args()
    base = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    if a.against == "skylakex":
        base.pop("OPENBLAS_CORETYPE", None)
        cases = {"default": dict(base), "OPENBLAS_CORETYPE=SkylakeX": dict(base, OPENBLAS_CORETYPE="SkylakeX")}
    else:
        cases = {"default": dict(base),
                 "Prescott, products on gemm.h's path": dict(base, OPENBLAS_CORETYPE="Prescott"),
                 "Prescott on OpenBLAS (PW_GEMM=openblas)": dict(base, OPENBLAS_CORETYPE="Prescott", PW_GEMM="openblas")}
    servers = {k: Server(a.build, a.job, env) for k, env in cases.items()}
    names = list(cases)
    for s in servers.values():
        s.step()  # warm-up: buffers, page faults, oneDNN's first call
    rounds = {k: [] for k in names}
    for r in range(a.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        got = {k: [] for k in names}
        for _ in range(a.steps):
            for k in order:
                got[k].append(servers[k].step())
        for k in names:
            rounds[k].append(statistics.median(got[k]))
        print(f"round {r + 1}: " + ", ".join(f"{k} {rounds[k][-1]:.1f} ms" for k in names), flush=True)
    for s in servers.values():
        s.close()
    med = {k: statistics.median(v) for k, v in rounds.items()}
    ratio = {k: [x / d for x, d in zip(rounds[k], rounds["default"])] for k in names}
    core = subprocess.run([os.path.join(a.build, "pipewright"), "--version"], capture_output=True, text=True).stdout
    res = {"job": os.path.relpath(a.job, ROOT), "rounds": a.rounds, "steps": a.steps,
           "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE", ""), "version": core.strip(),
           "step_ms": rounds, "median_ms": med,
           "ratio_to_default": {k: {"median": statistics.median(v), "min": min(v), "max": max(v)} for k, v in ratio.items()}}
    out = os.path.join(HERE, "results", "dispatch", "gemm-path" + ("-skylakex" if a.against == "skylakex" else ""))
    with open(out + ".json", "w") as f:
        json.dump(res, f, indent=1)
    lines = [f"# A step with OpenBLAS's kernel below the CPU: {res['job']}, one thread", "",
             f"{a.rounds} rounds × {a.steps} steps, rotating order; OPENBLAS_CORETYPE in the environment: "
             f"{res['openblas_coretype'] or '(unset)'}; {res['version']}.", "",
             "| case | step ms (median of rounds) | ÷ default (rounds' range) |", "|---|---|---|"]
    for k in names:
        q = res["ratio_to_default"][k]
        lines.append(f"| {k} | {med[k]:.1f} | {q['median']:.2f} ({q['min']:.2f}–{q['max']:.2f}) |")
    with open(out + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

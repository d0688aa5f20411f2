"""benchlib: what the harness's cases share — environments for one side or
the other, resident step servers, PyTorch at its best settings."""
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PY = os.environ.get("PW_BENCH_PYTHON", "/usr/bin/python3")  # the device machine: its venv's python3


def log(msg):
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def loadavg():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def env_for(threads, coretype, passive=False):
    e = dict(os.environ)
    e["OPENBLAS_NUM_THREADS"] = str(threads)
    e["OMP_NUM_THREADS"] = str(threads)
    e.pop("OMP_WAIT_POLICY", None)
    if passive:
        e["OMP_WAIT_POLICY"] = "PASSIVE"
    if coretype == "auto":  # OpenBLAS detects the CPU itself
        e.pop("OPENBLAS_CORETYPE", None)
    elif coretype:
        e["OPENBLAS_CORETYPE"] = coretype
    return e  # else: the environment's own choice, as everything else here runs


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


def torch_env(a, job, threads):
    """PyTorch at its best: with more than one thread, the OpenMP wait policy
    (libgomp's default, which spins a while before sleeping, or PASSIVE) that
    gives its step the lower median in a short probe (ACTIVE is not tried: its
    threads would spin on while pipewright computes, measuring the fight for
    the cores instead of either step). Returns (env, policy)."""
    if threads == 1:
        return env_for(1, a.coretype), "n/a (1 thread)"
    best = None
    for policy in ("default", "PASSIVE"):
        env = env_for(threads, a.coretype, passive=policy == "PASSIVE")
        th = Server(torch_cmd(job, threads), env)
        try:
            th.step()
            ms = statistics.median(th.step() for _ in range(2 if a.quick else 3))
        finally:
            th.close()
        log(f"  PyTorch {threads} threads, OMP_WAIT_POLICY {policy}: {ms:.0f} ms/step")
        if best is None or ms < best[0]:
            best = (ms, env, policy)
    return best[1], best[2]


def torch_cmd(job, threads):
    return [PY, os.path.join(HERE, "torch_step.py"), "--job", job, "--serve", "--foreach", "--threads", str(threads)]


def spread(x):
    return [min(x), max(x)] if x else None

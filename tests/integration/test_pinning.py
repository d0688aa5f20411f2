#!/usr/bin/env python3
"""test_pinning: ranks that share a host run on disjoint CPUs (issue 36) —
a real coordinator and real workers on this host.

  1. Two workers of 1 thread each, a pp 2 job: while it runs every thread of
     each worker (the loop, the compute thread; an OpenBLAS pool with more
     threads, which needs more CPUs than CI has) is allowed exactly one CPU, a different one for each worker, within what
     the workers reported they may use; the coordinator's log names them;
     once the job ends each worker's threads have every CPU again.
  2. Two workers of as many threads as the host has CPUs, a pp 2 job: they
     do not fit side by side, so neither is pinned (a half-pinned host
     would hand the floating rank everyone's CPUs) and the log says why.
  3. The job's result is the same as pipewright train's bit for bit either
     way (pinning changes where threads run, not what they compute).

Usage: test_pinning.py BUILD_DIR SOURCE_DIR"""
import os, re, sys, tempfile

BUILD, SRC = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import driver as d  # noqa: E402

SANITIZE = os.environ.get("PW_SANITIZE", "OFF") == "ON"
STEPS = 300 if SANITIZE else 800
check = d.Checks()


def spec(name):
    return {"name": name,
            "model": {"template": "gpt", "vocab_size": 256, "seq_len": 32, "d_model": 32, "n_layers": 2,
                      "n_heads": 2, "tie_embeddings": False},
            "mesh": {"pp": 2, "dp": 1}, "schedule": {"name": "1f1b", "microbatches": 2},
            "train": {"steps": STEPS, "batch_size": 4, "seed": 5, "checkpoint_every": 0,
                      "optimizer": {"name": "adamw", "lr": 3e-3}},
            "data": {"kind": "text", "path": os.path.join(SRC, "examples/data/corpus.txt"), "sampler": "random"}}


def allowed(pid):
    """{thread id: Cpus_allowed_list} of every thread of process pid."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for t in tids:
        try:
            for line in open(f"/proc/{pid}/task/{t}/status"):
                if line.startswith("Cpus_allowed_list:"):
                    out[t] = line.split()[1]
        except OSError:
            pass
    return out


def main():
    cpus = len(os.sched_getaffinity(0))
    if cpus < 2:
        print(f"SKIP test_pinning: this process may use {cpus} CPU (two ranks need two to be pinned apart)")
        return 77
    mine = sorted(os.sched_getaffinity(0))
    whole = f"{mine[0]}-{mine[-1]}" if mine == list(range(mine[0], mine[-1] + 1)) else None
    tmp = tempfile.mkdtemp(prefix="pw-pin-")
    ref = d.train_reference(BUILD, spec("ref"), tmp, "pin")

    # 1. one thread each: pinned apart
    c = d.Cluster(BUILD, tmp, "p1", data_root=SRC)
    for n in ("a", "b"):
        c.start_worker(n)
    check("two workers idle", c.wait_idle(2))
    jid = c.submit(spec("pinned"))
    check("the job runs", d.wait_for(lambda: c.step(jid) >= 5, 120, 0.05))
    seen = {n: allowed(p.pid) for n, p in c.workers.items()}
    per = {n: set(v.values()) for n, v in seen.items()}
    check("every thread of each worker is on one CPU of its own", all(len(v) == 1 for v in per.values()) and
          per["a"] != per["b"] and all(len(next(iter(v)).split(",")) == 1 and "-" not in next(iter(v))
                                       for v in per.values()), seen)
    check("that is every thread: the loop and the compute thread made after the pin (which inherits it)",
          all(len(v) >= 2 for v in seen.values()), {n: len(v) for n, v in seen.items()})
    log = c.log_text()
    check("the coordinator's log names the CPUs", re.search(r"job \d+: host \S+: rank 0 CPUs \d+, rank 1 CPUs \d+", log)
          is not None, log[-1500:])
    j = c.wait_job(jid, 300)
    check("the job succeeds", j.get("state") == "succeeded", j)
    diff = d.bit_diff(c.checkpoint(jid), ref)
    check("pinned, its model equals pipewright train's bit for bit", diff == "", diff)
    after = d.wait_for(lambda: all(set(allowed(p.pid).values()) == {whole} for p in c.workers.values()), 10, 0.1)
    check(f"after the job every thread has every CPU again ({whole})", whole is None or after,
          {n: allowed(p.pid) for n, p in c.workers.items()})
    d.stop_checked(c, check)

    # 2. threads = CPUs each: they cannot be pinned apart
    c = d.Cluster(BUILD, tmp, "p2", data_root=SRC)
    import subprocess
    for n in ("a", "b"):
        p = subprocess.Popen([os.path.join(BUILD, "pipewright-worker"), "--coordinator", f"127.0.0.1:{c.ctl}",
                              "--listen", "127.0.0.1:0", "--name", n, "--threads", str(cpus),
                              "--state-dir", os.path.join(tmp, f"p2-{n}")],
                             stdout=open(c.worker_log(n), "a"), stderr=subprocess.STDOUT,
                             env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
        d._track(p)
        c.workers[n] = p
    check("two workers idle", c.wait_idle(2))
    s2 = spec("unpinned")
    s2["train"]["steps"] = 20
    jid = c.submit(s2)
    j = c.wait_job(jid, 300)
    check("the job succeeds", j.get("state") == "succeeded", j)
    log = c.log_text()
    check("not pinned, and the log says why", re.search(r"ranks on host \S+ are not pinned: its 2 ranks want "
                                                        rf"{2 * cpus} CPUs", log) is not None, log[-1500:])
    wl = "".join(open(c.worker_log(n), errors="replace").read() for n in ("a", "b"))
    check("no worker says its threads were put on CPUs", "threads on CPUs" not in wl)
    d.stop_checked(c, check)

    return d.finish(tmp, check)


if __name__ == "__main__":
    try:
        sys.exit(main())
    finally:
        d._kill_all()

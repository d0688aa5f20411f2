#!/usr/bin/env python3
"""test_cgroup_resources: resources as the engine grants them
(common/base/sysres.h), in a real cgroup.

Two workers start inside one cgroup limited to 1 CPU and 2 GiB — a systemd
scope (systemd-run --scope -p CPUQuota=100% -p MemoryMax=2G) where systemd
is PID 1, else a cgroup v2 folder made under the cgroup2 mount (cpu.max
"100000 100000", memory.max 2G), else cgroup v1 folders made in the cpu and
memory hierarchies (cpu.cfs_quota_us 100000 of 100000, memory.limit_in_bytes
2G) — with one --host-id; the coordinator runs outside it, on loopback.

Checks:
  1. GET /v1/workers: each worker reports cores 1 and memory 2 GiB, and
     cores_from / memory_from name the cgroup files; its log says so.
  2. The planner's memory budget is theirs: a job a pipeline rank of which
     needs more than 2 GiB (and less than this machine has) is refused at
     submit, naming 2.0 GiB and the worker as the bound.
  3. The planner's contention is theirs: a pp 2 job on the two workers
     succeeds, and its contention says 2 ranks with 1 thread each share 1
     core on that host (with the machine's cores, 2 and more here, it would
     be none).
Usage: test_cgroup_resources.py BUILD_DIR SOURCE_DIR"""
import json, os, shutil, subprocess, sys, tempfile, time, urllib.error, urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "netns"))
from cgroup import Cgroup  # noqa: E402

BUILD, SRC = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
NAME = "test_cgroup_resources"
GIB = 1 << 30
FAILED = 0
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def check(label, ok, detail=""):
    global FAILED
    print(f"{'ok  ' if ok else 'FAIL'} {label}{(': ' + str(detail)) if detail and not ok else ''}", flush=True)
    FAILED += not ok
    return ok


def skip(why):
    print(f"SKIP {NAME}: {why}")
    sys.exit(77)


# ---- the daemons -------------------------------------------------------------------------

def api(base, path, body=None):
    req = urllib.request.Request(base + path, data=body.encode() if body is not None else None,
                                 headers={"Content-Type": "application/json"} if body is not None else {},
                                 method="POST" if body is not None else "GET")
    try:
        with OPENER.open(req, timeout=30) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def wait(what, cond, timeout=30):
    t0 = time.time()
    while time.time() - t0 < timeout:
        v = cond()
        if v:
            return v
        time.sleep(0.1)
    return None


def tiny_job(steps):
    j = json.load(open(os.path.join(SRC, "examples/jobs/gpt-tiny.json")))
    j["name"] = "cgroup-pp2"
    j["model"].update(d_model=32, n_layers=2, n_heads=2, seq_len=32)
    j["train"].update(steps=steps, batch_size=4, checkpoint_every=steps)
    j["data"]["path"] = os.path.join(SRC, j["data"]["path"])
    return j


def main():
    tmp = tempfile.mkdtemp(prefix="pw-cgroup.")
    cg = Cgroup(f"pw-test-{os.getpid()}", cpus=1, memory=2 * GIB)
    if not cg.ok:
        shutil.rmtree(tmp)
        skip(cg.why)
    print(f"cgroup: {cg.how}", flush=True)
    procs = []
    try:
        ready = os.path.join(tmp, "ready.json")
        coord = subprocess.Popen([os.path.join(BUILD, "pipewright-coordinator"), "--http", "127.0.0.1:0", "--control",
                                  "127.0.0.1:0", "--state-dir", os.path.join(tmp, "coord"), "--ready-file", ready,
                                  "--data-root", SRC], stdout=open(os.path.join(tmp, "coordinator.log"), "w"),
                                 stderr=subprocess.STDOUT)
        procs.append(coord)
        if not wait("coordinator", lambda: os.path.exists(ready) and os.path.getsize(ready) > 0, 20):
            return check("the coordinator starts", False, open(os.path.join(tmp, "coordinator.log")).read()[-400:])
        ports = json.load(open(ready))
        base = f"http://127.0.0.1:{ports['http']}"
        env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "PW_HOST_ID": "cg-host"}
        for i in range(2):
            cmd = cg.prefix + [os.path.join(BUILD, "pipewright-worker"), "--coordinator",
                               f"127.0.0.1:{ports['control']}", "--listen", "127.0.0.1:0", "--name", f"cgw{i}",
                               "--state-dir", os.path.join(tmp, f"w{i}")]
            procs.append(subprocess.Popen(cmd, stdout=open(os.path.join(tmp, f"w{i}.log"), "w"),
                                          stderr=subprocess.STDOUT, env=env, preexec_fn=cg.enter))

        # 1. what they report
        def idle():
            st, r = api(base, "/v1/workers")
            ws = [w for w in r.get("workers", []) if w["state"] == "idle"] if st == 200 else []
            return ws if len(ws) == 2 else None
        ws = wait("workers", idle)
        if not check("both workers register", ws is not None):
            return
        for w in ws:
            print(f"  {w['name']}: cores {w['cores']} ({w.get('cores_from')}), memory {w.get('memory')} "
                  f"({w.get('memory_from')}), host {w.get('host')}")
            check(f"{w['name']} reports 1 core", w["cores"] == 1, w)
            check(f"{w['name']} reports 2 GiB", w.get("memory") == 2 * GIB, w)
            cf, mf = w.get("cores_from") or "", w.get("memory_from") or ""
            check(f"{w['name']}: cores from the cgroup's quota", ("cpu.max" in cf or "cpu.cfs_quota_us" in cf), cf)
            check(f"{w['name']}: memory from the cgroup's limit",
                  ("memory.max" in mf or "memory.limit_in_bytes" in mf) and "2.0 GiB" in mf, mf)
            check(f"{w['name']}: the host id given by PW_HOST_ID", w.get("host") == "cg-host", w.get("host"))
        log = open(os.path.join(tmp, "w0.log")).read()
        check("the worker's log says what it may use", "resources: 1 core (" in log and "2.0 GiB of memory" in log,
              log[-600:])

        # 2. the memory budget: a rank needing ~3 GiB is refused against the workers' 2 GiB
        big = tiny_job(2)
        big["name"] = "cgroup-too-big"
        big["model"].update(d_model=2048, n_layers=8, n_heads=16, seq_len=32)
        st, r = api(base, "/v1/jobs", json.dumps(big))
        msg = json.dumps(r)
        check("a job over the workers' 2 GiB is refused at submit",
              st == 422 and "2.0 GiB" in msg and "the memory of worker cgw" in msg, f"HTTP {st}: {msg[:400]}")

        # 3. the contention note: 2 ranks with 1 thread each on 1 core
        st, r = api(base, "/v1/jobs", json.dumps(tiny_job(4)))
        if not check("a pp 2 job is accepted", st == 201, f"HTTP {st}: {r}"):
            return
        jid = r["id"]
        job = wait("job", lambda: (lambda j: j if j["state"] in ("succeeded", "failed", "cancelled") else None)(
            api(base, f"/v1/jobs/{jid}")[1]), 120)
        if not check("the job succeeds", job is not None and job["state"] == "succeeded",
                     job and (job["state"], job.get("status"))):
            return
        ct = job.get("contention") or {}
        hosts = ct.get("hosts") or []
        print(f"  contention: {ct.get('message')}")
        check("the plan's contention counts the workers' 1 core",
              len(hosts) == 1 and hosts[0]["host"] == "cg-host" and hosts[0]["cores"] == 1 and
              hosts[0]["threads"] == 2 and "share 1 core" in ct.get("message", ""), ct)
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        cg.remove()
        if FAILED:
            for f in sorted(os.listdir(tmp)):
                if f.endswith(".log"):
                    print(f"---- {f}\n" + open(os.path.join(tmp, f)).read()[-1500:])
        shutil.rmtree(tmp, ignore_errors=True)


main()
print(("FAIL" if FAILED else "PASS") + f" {NAME}")
sys.exit(1 if FAILED else 0)

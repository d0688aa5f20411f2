#!/usr/bin/env python3
"""test_ckpt_store: checkpoints in the coordinator's store — a real
coordinator and real workers on loopback.

  1. A pp=2 job, 20 steps, checkpoint_every 1, keep_checkpoints 3: exactly
     3 step folders (18, 19, 20) on the coordinator's disk, each with every
     stage's model and optimizer file; each downloads (?step=N) and loads
     (`pipewright eval --checkpoint`); step 17 is a 404 naming it; no
     worker's state dir holds a checkpoint; the workers report absolute
     paths; DELETE ?purge=1 removes the job's folder.
  2. Resume from the coordinator's copy: a long job is interrupted
     (coordinator SIGTERM: the job goes back to queued) once a step is
     stored; its workers are killed and fresh ones start with new, empty
     state dirs; the restarted coordinator resumes the job from that step
     and its final weights equal an uninterrupted run's bit for bit. The
     newest stored step has a bit flipped on the coordinator's disk
     meanwhile: the job resumes from the one before, and an event names the
     step passed over and why (it used to hand the damaged one to the
     workers, whose load failed the job at every retry).
Usage: test_ckpt_store.py BUILD_DIR SOURCE_DIR"""
import json, os, shutil, signal, sqlite3, subprocess, sys, tempfile, time, urllib.error, urllib.request

BUILD, SRC = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
sys.path.insert(0, os.path.join(SRC, "tests", "ref"))
import st  # noqa: E402  (safetensors in pure Python)

PASSED = FAILED = 0


def check(label, ok, detail=""):
    global PASSED, FAILED
    print(f"{'ok  ' if ok else 'FAIL'} {label}{(': ' + str(detail)[:600]) if detail and not ok else ''}", flush=True)
    PASSED += bool(ok)
    FAILED += not ok
    return ok


def http(base, path, method="GET", body=None, raw=False):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            status, out = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, out = e.code, e.read()
    if raw and status == 200:
        return status, out
    try:
        return status, json.loads(out)
    except ValueError:
        return status, out


def wait(pred, timeout=60, every=0.1):
    t0 = time.time()
    while time.time() - t0 < timeout:
        v = pred()
        if v:
            return v
        time.sleep(every)
    return pred()


class Coord:
    def __init__(self, tmp, state):
        self.tmp, self.state = tmp, state
        ready = os.path.join(tmp, "ready.json")
        if os.path.exists(ready):
            os.unlink(ready)
        self.proc = subprocess.Popen([os.path.join(BUILD, "pipewright-coordinator"), "--http", "127.0.0.1:0",
                                      "--control", "127.0.0.1:0", "--state-dir", state, "--ready-file", ready],
                                     stdout=open(os.path.join(tmp, "coordinator.log"), "a"), stderr=subprocess.STDOUT)
        wait(lambda: os.path.exists(ready), 20, 0.05)
        ports = json.load(open(ready))
        self.base = f"http://127.0.0.1:{ports['http']}"
        self.ctl = ports["control"]

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(30)


def start_worker(tmp, coord, name, state):
    # a relative --state-dir from another cwd: reported paths must still be absolute
    os.makedirs(os.path.join(tmp, "cwd"), exist_ok=True)
    return subprocess.Popen([os.path.join(BUILD, "pipewright-worker"), "--coordinator", f"127.0.0.1:{coord.ctl}",
                             "--listen", "127.0.0.1:0", "--name", name, "--state-dir", state],
                            cwd=os.path.join(tmp, "cwd"), stdout=open(os.path.join(tmp, name + ".log"), "a"),
                            stderr=subprocess.STDOUT)


def spec(name, steps, every, keep, d=32):
    return {"name": name, "model": {"template": "gpt", "vocab_size": 64, "seq_len": 16, "d_model": d, "n_layers": 2,
                                    "n_heads": 2},
            "mesh": {"pp": 2}, "schedule": {"name": "1f1b", "microbatches": 2},
            "train": {"steps": steps, "batch_size": 4, "checkpoint_every": every, "keep_checkpoints": keep,
                      "optimizer": {"name": "adamw", "lr": 1e-3}},
            "data": {"kind": "copy"}}


def job_state(c, j, states=("succeeded", "failed", "cancelled"), timeout=180):
    return wait(lambda: (lambda x: x if x.get("state") in states else None)(http(c.base, f"/v1/jobs/{j}")[1]),
                timeout, 0.2) or http(c.base, f"/v1/jobs/{j}")[1]


def files_under(d, suffix=".safetensors"):
    out = []
    for root, _, fs in os.walk(d):
        out += [os.path.join(root, f) for f in fs if f.endswith(suffix)]
    return out


def tensors(path):
    return {k: v for k, v in st.load(path)[0].items()} if hasattr(st, "load") else open(path, "rb").read()


def retention(tmp):
    c = Coord(tmp, os.path.join(tmp, "coord"))
    ws = [start_worker(tmp, c, f"w{i}", f"ws{i}") for i in range(2)]
    try:
        check("2 workers", wait(lambda: sum(w["state"] == "idle" for w in http(c.base, "/v1/workers")[1]["workers"]) == 2, 30))
        sp = spec("keep3", 20, 1, 3)
        st_, r = http(c.base, "/v1/jobs", "POST", sp)
        j = r["id"]
        job = job_state(c, j)
        check("the 20-step job succeeds", job["state"] == "succeeded", job)
        d = os.path.join(tmp, "coord", "checkpoints", f"job-{j}")
        steps = sorted(os.listdir(d)) if os.path.isdir(d) else []
        check("exactly 3 step folders remain", steps == ["step-18", "step-19", "step-20"], steps)
        for s in steps:
            fs = sorted(os.listdir(os.path.join(d, s)))
            check(f"{s} holds each stage's model and optimizer file", fs == [
                "stage-0.optim.safetensors", "stage-0.safetensors", "stage-1.optim.safetensors", "stage-1.safetensors"], fs)
        _, cks = http(c.base, f"/v1/jobs/{j}/checkpoints")
        check("the API lists steps 18..20", [x["step"] for x in cks["checkpoints"]] == [18, 19, 20], cks)
        jf = os.path.join(tmp, "keep3.json")
        json.dump(sp, open(jf, "w"))
        for s in (18, 19, 20):
            code, data = http(c.base, f"/v1/jobs/{j}/checkpoint?step={s}", raw=True)
            f = os.path.join(tmp, f"dl-{s}.safetensors")
            ok = code == 200 and isinstance(data, bytes)
            if ok:
                open(f, "wb").write(data)
            ev = subprocess.run([os.path.join(BUILD, "pipewright"), "eval", "--job", jf, "--checkpoint", f],
                                capture_output=True, text=True, cwd=SRC, env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
            check(f"step {s} downloads and loads (pipewright eval)", ok and ev.returncode == 0, (code, ev.stderr[-300:]))
        code, err = http(c.base, f"/v1/jobs/{j}/checkpoint?step=17")
        check("a removed step is a 404 naming it", code == 404 and "step 17" in err["error"]["message"], (code, err))
        left = files_under(os.path.join(tmp, "cwd"))
        check("no worker's state dir holds a checkpoint", left == [], left)
        db = sqlite3.connect(os.path.join(tmp, "coord", "pipewright.db"))
        paths = [p for (p,) in db.execute("SELECT path FROM checkpoints WHERE job_id = ?", (j,))]
        db.close()
        check("every path a worker reported is absolute", paths and all(p.startswith("/") for p in paths), paths[:3])
        code, r = http(c.base, f"/v1/jobs/{j}?purge=1", "DELETE")
        check("purge answers 200", code == 200 and r.get("purged") is True, (code, r))
        check("purge removed the job's folder", not os.path.exists(d), os.listdir(d) if os.path.exists(d) else "")
    finally:
        for w in ws:
            w.kill()
            w.wait()
        c.stop()


def resume(tmp):
    state = os.path.join(tmp, "coord2")
    c = Coord(tmp, state)
    ws = [start_worker(tmp, c, f"r{i}", f"rs{i}") for i in range(2)]
    steps = 300
    sp = spec("resume", steps, 10, 2, d=64)
    try:
        check("2 workers (resume)", wait(lambda: sum(w["state"] == "idle" for w in http(c.base, "/v1/workers")[1]["workers"]) == 2, 30))
        _, r = http(c.base, "/v1/jobs", "POST", sp)
        j = r["id"]
        got = wait(lambda: len(http(c.base, f"/v1/jobs/{j}/checkpoints")[1].get("checkpoints") or []) >= 2, 120,
                   0.05)
        job = http(c.base, f"/v1/jobs/{j}")[1]
        check("two steps are stored while the job runs", got and job["state"] == "running", job)
    finally:
        c.stop()  # first: the running job goes back to the queue
        for w in ws:
            w.kill()
            w.wait()
    db = sqlite3.connect(os.path.join(state, "pipewright.db"))
    stored = [r[0] for r in db.execute("SELECT step FROM ckpt_steps WHERE job_id = ? ORDER BY step DESC", (j,))]
    db.close()
    newest = stored[0]
    shard = os.path.join(state, "checkpoints", f"job-{j}", f"step-{newest}", "stage-1.safetensors")
    b = bytearray(open(shard, "rb").read())
    b[-1] ^= 0x10  # the last byte is tensor data
    open(shard, "wb").write(b)
    # fresh workers, empty state dirs: only the coordinator has the checkpoint
    for i in range(2):
        shutil.rmtree(os.path.join(tmp, "cwd", f"rs{i}"), ignore_errors=True)
    c = Coord(tmp, state)
    ws = [start_worker(tmp, c, f"n{i}", f"ns{i}") for i in range(2)]
    try:
        job = job_state(c, j, timeout=240)
        check("the interrupted job succeeds after the restart", job["state"] == "succeeded", job)
        _, ev = http(c.base, f"/v1/jobs/{j}/events")
        msgs = [e["message"] for e in ev["events"]]
        check(f"it resumed from the checkpoint before the damaged one (step {stored[1]})",
              any(f"from the checkpoint of step {stored[1]}" in m for m in msgs), msgs[-6:])
        check(f"an event names step {newest}, passed over, and why",
              any(f"passed over as unreadable: the checkpoint of step {newest} (" in m and "checksum mismatch" in m
                  for m in msgs), msgs[-6:])
        code, a = http(c.base, f"/v1/jobs/{j}/checkpoint", raw=True)
        _, r2 = http(c.base, "/v1/jobs", "POST", dict(sp, name="resume"))
        job2 = job_state(c, r2["id"], timeout=240)
        code2, b = http(c.base, f"/v1/jobs/{r2['id']}/checkpoint", raw=True)
        check("its final weights equal an uninterrupted run's bit for bit",
              code == 200 and code2 == 200 and job2["state"] == "succeeded" and a == b,
              (code, code2, job2.get("state"), len(a) if isinstance(a, bytes) else a))
    finally:
        for w in ws:
            w.kill()
            w.wait()
        c.stop()


def main():
    tmp = tempfile.mkdtemp(prefix="pw-ckpt-")
    try:
        retention(tmp)
        resume(tmp)
    finally:
        if not FAILED:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"logs kept in {tmp}")
    print(f"{PASSED} passed, {FAILED} failed")
    sys.exit(1 if FAILED else 0)


main()

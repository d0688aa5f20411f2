#!/usr/bin/env python3
"""test_coord_faults: nothing lost, nothing wedged — a real coordinator and
real workers on loopback, with the coordinator's store made to fail.

  1. Store writes fail mid-job (PW_STORE_FAIL_FILE: every write fails while
     the file exists): the ranks finish, the job is not yet recorded as
     done, /healthz answers 503 naming the error, /metrics counts the
     failures and the pending writes, the log names each step kept; the
     file removed, every step's row lands and the job ends succeeded.
  2. The same with a real full disk: the state dir on a small tmpfs, filled
     up mid-job, then freed (skipped when mount is not permitted).
  3. A diverged run (lr 1e30: the loss is NaN from step 1): the job fails
     with "diverged at step 1", the step's loss and gradient norm are null,
     no row says 0; with train.on_nonfinite "skip" the job goes on and
     records nulls.
  4. Planning off the loop: a spec that plans for seconds (131072
     microbatches) shows as planning, heartbeats go on (no worker is
     dropped with a 2 s timeout), cancelling it works, and the workers run
     the next job.
  5. --worker-expiry 1: a killed worker is shown lost, then leaves /v1/workers.
  6. Two coordinators on one state directory: the second refuses to start,
     naming the first's pid, and the first goes on; once the first is
     killed (-9), a new one starts there.
  7. A worker whose name holds a newline (a forged log line): refused with
     a reason, the log shows the name escaped on one line, no forged line;
     pipewright-worker itself refuses such a --name.
Usage: test_coord_faults.py BUILD_DIR SOURCE_DIR"""
import json, os, signal, sqlite3, subprocess, sys, tempfile, time, urllib.error, urllib.request

import driver

BUILD, SRC = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
PASSED = FAILED = 0


def check(label, ok, detail=""):
    global PASSED, FAILED
    print(f"{'ok  ' if ok else 'FAIL'} {label}{(': ' + str(detail)[:600]) if detail and not ok else ''}", flush=True)
    PASSED += bool(ok)
    FAILED += not ok
    return ok


def http(base, path, method="GET", body=None):
    """(status, parsed JSON or text)"""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            status, raw = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


def wait(pred, timeout=60, every=0.1):
    t0 = time.time()
    while time.time() - t0 < timeout:
        v = pred()
        if v:
            return v
        time.sleep(every)
    return pred()


def metric(text, name):
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


class System:
    def __init__(self, tmp, tag, state=None, env=None, args=()):
        self.tmp, self.tag, self.procs = tmp, tag, []
        self.state = state or os.path.join(tmp, tag + "-coord")
        ready = os.path.join(tmp, tag + "-ready.json")
        self.log = os.path.join(tmp, tag + "-coordinator.log")
        self.coord = subprocess.Popen([os.path.join(BUILD, "pipewright-coordinator"), "--http", "127.0.0.1:0",
                                       "--control", "127.0.0.1:0", "--state-dir", self.state, "--ready-file", ready,
                                       "--data-root", SRC, *args], stdout=open(self.log, "a"), stderr=subprocess.STDOUT, cwd=SRC,
                                      env={**os.environ, **(env or {})})
        wait(lambda: os.path.exists(ready), 20, 0.05)
        ports = json.load(open(ready))
        self.base = f"http://127.0.0.1:{ports['http']}"
        self.ctl_port = ports["control"]

    def start_workers(self, n):
        for i in range(n):
            name = f"{self.tag}-w{i}"
            self.procs.append(subprocess.Popen(
                [os.path.join(BUILD, "pipewright-worker"), "--coordinator", f"127.0.0.1:{self.ctl_port}",
                 "--listen", "127.0.0.1:0", "--name", name, "--state-dir", os.path.join(self.tmp, name)],
                stdout=open(os.path.join(self.tmp, name + ".log"), "a"), stderr=subprocess.STDOUT))

    def workers(self):
        return http(self.base, "/v1/workers")[1]["workers"]

    def n_workers(self, state):
        return sum(w["state"] == state for w in self.workers())

    def job(self, jid):
        return http(self.base, f"/v1/jobs/{jid}")[1]

    def wait_job(self, jid, states=("succeeded", "failed", "cancelled"), timeout=120):
        return wait(lambda: (lambda j: j if j.get("state") in states else None)(self.job(jid)), timeout, 0.2) \
            or self.job(jid)

    def submit(self, spec):
        st, r = http(self.base, "/v1/jobs", "POST", spec)
        assert st == 201 or st == 200, (st, r)
        return r["id"]

    def log_text(self):
        return open(self.log).read()

    def stop(self):
        for p in self.procs + [self.coord]:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs + [self.coord]:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        # a clean exit: under the sanitizers a leak or a bad access is not
        check(f"{self.tag}: the coordinator exits cleanly on SIGTERM", self.coord.returncode == 0,
              self.coord.returncode)


def medium(steps):
    """A job of a few seconds: steps of tens of milliseconds."""
    return {"name": "medium", "model": {"template": "gpt", "vocab_size": 256, "seq_len": 64, "d_model": 64,
                                        "n_layers": 4, "n_heads": 4},
            "mesh": {"pp": 2}, "schedule": {"name": "1f1b", "microbatches": 4},
            "train": {"steps": steps, "batch_size": 16, "optimizer": {"name": "adamw", "lr": 1e-3}},
            "data": {"kind": "text", "path": os.path.join(SRC, "examples/data/corpus.txt")}}


def tiny(steps, **train):
    return {"name": "tiny", "model": {"template": "gpt", "vocab_size": 256, "seq_len": 8, "d_model": 16,
                                      "n_layers": 2, "n_heads": 2},
            "mesh": {"pp": 2}, "schedule": {"name": "1f1b", "microbatches": 2},
            "train": {"steps": steps, "batch_size": 4, "optimizer": {"name": "adamw", "lr": 1e-3}, **train},
            "data": {"kind": "text", "path": os.path.join(SRC, "examples/data/corpus.txt")}}


def store_outage(tmp, tag, fail, recover, state=None, env=None):
    """A 200-step job (120 sanitized; every step's timings sampled); fail() mid-run, the
    ranks finish, recover()."""
    s = System(tmp, tag, state=state, env=env)
    try:
        s.start_workers(2)
        check(f"{tag}: 2 workers", wait(lambda: s.n_workers("idle") == 2, 30))
        steps = 120 if os.environ.get("PW_SANITIZE") == "ON" else 200
        jid = s.submit(medium(steps))
        check(f"{tag}: the job runs", wait(lambda: s.job(jid)["progress"]["step"] >= 5, 60), s.job(jid))
        fail()
        # the ranks run to the end while nothing can be recorded; their last
        # checkpoint cannot be stored, so they try it again and again (they
        # used to give up after three tries, and the job then ended
        # succeeded without its model)
        wlogs = [os.path.join(tmp, f"{tag}-w{i}.log") for i in range(2)]
        final = f"checkpoint of step {steps}, stage "
        check(f"{tag}: the ranks reach the last step and retry its checkpoint",
              wait(lambda: all(final in t and "(the run's last: until stored)" in t
                               for t in (open(f, errors="replace").read() for f in wlogs)), 120),
              [open(f, errors="replace").read()[-400:] for f in wlogs])
        check(f"{tag}: the workers stay on the job meanwhile", s.n_workers("busy") == 2, s.workers())
        j = s.job(jid)
        check(f"{tag}: the job is not recorded as done yet", j["state"] == "running" and j["progress"]["step"] < steps, j)
        st, h = http(s.base, "/healthz")
        check(f"{tag}: /healthz is 503 naming the store's error", st == 503 and h["error"]["code"] == "unavailable"
              and "full" in h["error"]["message"], (st, h))
        st, m = http(s.base, "/metrics")
        check(f"{tag}: /metrics counts failed and pending writes", metric(m, "pipewright_store_write_failures_total") > 0
              and metric(m, "pipewright_store_writes_pending") > 0, m[-600:])
        log = s.log_text()
        check(f"{tag}: the log names each kept step", f"job {jid} run" in log and
              f"step {steps - 1} metrics failed" in log and "kept in memory" in log, log[-800:])
        recover()
        j = s.wait_job(jid, timeout=60)
        check(f"{tag}: once the store works the job ends succeeded", j["state"] == "succeeded", j)
        ck = http(s.base, f"/v1/jobs/{jid}/checkpoints")[1]
        ck = ck.get("checkpoints", ck) if isinstance(ck, dict) else ck
        check(f"{tag}: with its final checkpoint stored", steps in [c["step"] for c in ck], ck)
        st, _ = http(s.base, f"/v1/jobs/{jid}/checkpoint")
        check(f"{tag}: and downloadable", st == 200, st)
        rows = http(s.base, f"/v1/jobs/{jid}/metrics")[1]["metrics"]
        check(f"{tag}: every step's row is recorded", [r["step"] for r in rows] == list(range(steps)),
              [r["step"] for r in rows][:10])
        check(f"{tag}: /healthz is 200 again", wait(lambda: http(s.base, "/healthz")[0] == 200, 10))
        m = http(s.base, "/metrics")[1]
        check(f"{tag}: nothing pending, nothing lost", metric(m, "pipewright_store_writes_pending") == 0 and
              metric(m, "pipewright_store_writes_lost_total") == 0, m[-600:])
        tl = http(s.base, f"/v1/jobs/{jid}/timeline?step={steps - 1}")[1]
        check(f"{tag}: the last sampled step has both ranks' timings", len(tl.get("ranks", [])) == 2, tl)
    finally:
        s.stop()


def injected_outage(tmp):
    flag = os.path.join(tmp, "store-full")
    store_outage(tmp, "inject", lambda: open(flag, "w").close(), lambda: os.unlink(flag),
                 env={"PW_STORE_FAIL_FILE": flag})


def tmpfs_outage(tmp):
    mnt = os.path.join(tmp, "small")
    os.makedirs(mnt)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", mnt], capture_output=True).returncode:
        print("skip: a real full disk (mount -t tmpfs is not permitted here)")
        return
    filler = os.path.join(mnt, "filler")

    def fill():
        used = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(mnt) for f in fs)
        print(f"     (the state dir holds {used} bytes; filling the rest)", flush=True)
        driver.fill_disk(filler)

    try:
        store_outage(tmp, "tmpfs", fill, lambda: os.path.exists(filler) and os.unlink(filler),
                     state=os.path.join(mnt, "coord"))
    finally:
        subprocess.run(["umount", "-l", mnt])


def divergence(tmp):
    s = System(tmp, "div")
    try:
        s.start_workers(2)
        check("div: 2 workers", wait(lambda: s.n_workers("idle") == 2, 30))
        spec = tiny(8, grad_clip=0)
        spec["train"]["optimizer"] = {"name": "sgd", "lr": 1e30}
        jid = s.submit(spec)
        j = s.wait_job(jid)
        check("div: a diverged job fails", j["state"] == "failed" and "diverged at step 1" in (j.get("error") or ""), j)
        rows = http(s.base, f"/v1/jobs/{jid}/metrics")[1]["metrics"]
        by = {r["step"]: r for r in rows}
        check("div: step 0 is finite", 0 in by and by[0]["loss"] and by[0]["loss"] > 0, rows)
        check("div: step 1's loss and grad norm are null, not 0", 1 in by and by[1]["loss"] is None and
              by[1]["grad_norm"] is None, rows)
        check("div: no row says loss 0", all(r["loss"] != 0 for r in rows), rows)
        nf = lambda: [metric(http(s.base, "/metrics")[1], 'pipewright_steps_nonfinite_total{on_nonfinite="%s"}' % k)
                      for k in ("fail", "skip")]  # noqa: E731
        check("div: /metrics counts the diverged step", nf() == [1, 0], nf())
        spec["train"]["on_nonfinite"] = "skip"
        jid = s.submit(spec)
        j = s.wait_job(jid)
        rows = http(s.base, f"/v1/jobs/{jid}/metrics")[1]["metrics"]
        check("div: on_nonfinite skip goes on to the end", j["state"] == "succeeded" and len(rows) == 8, (j, rows))
        check("div: ... recording the non-finite steps as null", all(r["loss"] is None for r in rows[1:]), rows)
        ev = http(s.base, f"/v1/jobs/{jid}/events")[1]["events"]
        check("div: ... with an event per such step", sum(e["kind"] == "nonfinite" for e in ev) == 7, ev)
        check("div: ... and /metrics counts them", nf() == [1, 7], nf())
        st, r = http(s.base, "/v1/jobs", "POST", {**spec, "train": {**spec["train"], "on_nonfinite": "ignore"}})
        check("div: on_nonfinite takes fail or skip", st == 422 and "on_nonfinite" in r["error"]["path"], r)
    finally:
        s.stop()


def planning(tmp):
    # a plan above the default budget (--max-plan-actions) that takes longer
    # than the heartbeat timeout (about 1.8 s here against 1 s)
    s = System(tmp, "plan", args=("--heartbeat-timeout", "1", "--max-plan-actions", "1000000"))
    try:
        s.start_workers(2)
        check("plan: 2 workers", wait(lambda: s.n_workers("idle") == 2, 30))
        big = tiny(2)
        big["schedule"]["microbatches"] = big["train"]["batch_size"] = 65536
        jid = s.submit(big)
        check("plan: a long plan shows as planning", wait(lambda: s.job(jid)["state"] == "planning", 30, 0.02),
              s.job(jid))
        st, r = http(s.base, f"/v1/jobs/{jid}", "DELETE")
        check("plan: cancelling it meanwhile works", st == 200 and s.wait_job(jid, timeout=60)["state"] == "cancelled",
              (st, r, s.job(jid)))
        check("plan: the plan comes back and is dropped", wait(lambda: "ended meanwhile" in s.log_text(), 120))
        check("plan: no worker was dropped while it planned", "no heartbeat" not in s.log_text() and
              s.n_workers("lost") == 0, s.workers())
        check("plan: the workers are idle again", wait(lambda: s.n_workers("idle") == 2, 30), s.workers())
        jid = s.submit(tiny(3))
        check("plan: they run the next job", s.wait_job(jid)["state"] == "succeeded", s.job(jid))
    finally:
        s.stop()


def expiry(tmp):
    s = System(tmp, "exp", args=("--worker-expiry", "1"))
    try:
        s.start_workers(1)
        check("expiry: a worker", wait(lambda: s.n_workers("idle") == 1, 30))
        s.procs[0].kill()
        s.procs[0].wait()
        check("expiry: killed, it is lost", wait(lambda: s.n_workers("lost") == 1, 20, 0.05), s.workers())
        check("expiry: then it leaves /v1/workers", wait(lambda: s.workers() == [], 20), s.workers())
        st, r = http(s.base, "/metrics")
        check("expiry: and the gauges", metric(r, 'pipewright_workers{state="lost"}') == 0, r)
    finally:
        s.stop()


def second_coordinator(tmp):
    s = System(tmp, "two")
    try:
        s.start_workers(2)
        check("two: workers", wait(lambda: s.n_workers("idle") == 2, 30))
        jid = s.submit(tiny(100000))
        check("two: the first's job runs", wait(lambda: s.job(jid)["state"] == "running" and s.n_workers("busy") == 2, 30),
              s.job(jid))
        try:  # (one that starts runs until killed at the timeout)
            second = subprocess.run([os.path.join(BUILD, "pipewright-coordinator"), "--http", "127.0.0.1:0",
                                     "--control", "127.0.0.1:0", "--state-dir", s.state], capture_output=True,
                                    text=True, timeout=30)
            said = (second.returncode, second.stderr)
        except subprocess.TimeoutExpired:
            said = (None, "the second coordinator started and ran for 30 s")
        check("two: the second exits 1, naming the holder's pid",
              said[0] == 1 and f"in use by another coordinator (pid {s.coord.pid} " in said[1], said)
        check("two: the first's job still runs, on its worker",
              s.job(jid)["state"] == "running" and s.n_workers("busy") == 2, (s.job(jid), s.workers()))
        s.coord.kill()
        s.coord.wait()
        t = System(tmp, "two-after", state=s.state)
        try:
            check("two: after kill -9 a new coordinator starts there and has the job",
                  t.job(jid).get("state") in ("queued", "running"), t.job(jid))
            http(t.base, f"/v1/jobs/{jid}", "DELETE")
        finally:
            t.stop()
    finally:
        for p in s.procs:
            p.kill()
            p.wait()


def control_names(tmp):
    s = System(tmp, "names")
    try:
        forged = "FORGED ERROR coordinator: every job deleted"
        reg = {"type": "register", "version": 7, "name": "evil\n" + forged, "token": "", "data_addr": "127.0.0.1:9",
               "cores": 1, "threads": 1, "software": "test"}
        reply = driver.control_exchange(s.ctl_port, reg)
        check("names: a name with a newline is refused, saying why",
              reply.get("type") == "refused" and "control characters" in reply.get("reason", ""), reply)
        check("names: it is not a worker", s.workers() == [], s.workers())
        log = s.log_text()
        check("names: the log shows it escaped on one line, no forged line",
              "refusing worker 'evil\\x0a" + forged + "'" in log and
              not any(line.startswith(forged) for line in log.splitlines()), log[-600:])
        try:  # (one that starts keeps trying to register until killed at the timeout)
            w = subprocess.run([os.path.join(BUILD, "pipewright-worker"), "--coordinator", f"127.0.0.1:{s.ctl_port}",
                                "--name", "a\tb", "--state-dir", os.path.join(tmp, "names-w")],
                               capture_output=True, text=True, timeout=20)
            said = (w.returncode, w.stderr)
        except subprocess.TimeoutExpired:
            said = (None, "the worker started and ran for 20 s")
        check("names: pipewright-worker refuses such a --name", said[0] == 2 and "control characters" in said[1], said)
    finally:
        s.stop()


def main():
    with tempfile.TemporaryDirectory(prefix="pw-faults-") as tmp:
        try:
            for part in (control_names, second_coordinator, expiry, divergence, planning, injected_outage, tmpfs_outage):
                part(tmp)
        finally:
            if FAILED:
                for f in sorted(os.listdir(tmp)):
                    if f.endswith(".log"):
                        print(f"--- {f} (tail)")
                        print("".join(open(os.path.join(tmp, f)).readlines()[-15:]))
    print(f"{PASSED} passed, {FAILED} failed")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())

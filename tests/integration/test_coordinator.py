#!/usr/bin/env python3
"""test_coordinator: the whole system on loopback — a real
pipewright-coordinator, real pipewright-worker processes, jobs submitted
with curl, followed through the REST API, checked against the
single-process trainer and against what SQLite recorded.

  1. examples/jobs/gpt-pp4.json (pp 4, 1f1b, 8 microbatches) on 4 workers:
     succeeded; the loss fell; the downloaded checkpoint equals
     `pipewright train`'s to 1e-5; the store holds the job, the run, the
     partition, every rank's action list, one metrics row per step, events.
  2. The same job with zb-h1 and with interleaved-1f1b (V = 2) on pp = 2.
  3. A job needing more workers than are idle waits and says so; cancel.
  4. kill -9 of the coordinator with a queued and a finished job; restarted
     on the same database both are intact and the workers re-register.
  5. A slice changed on the way (a proxy on the control link flips one byte
     of the assign's slice): the worker refuses it, the job fails naming the
     hash mismatch; the same worker then runs the job sent intact.
Usage: test_coordinator.py BUILD_DIR SOURCE_DIR"""
import json, os, signal, socket, sqlite3, struct, subprocess, sys, tempfile, threading, time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "ref"))
import numpy as np  # noqa: E402
import st  # noqa: E402

BUILD, SRC = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
PASSED = FAILED = 0


def check(label, ok, detail=""):
    global PASSED, FAILED
    print(f"{'ok  ' if ok else 'FAIL'} {label}{(': ' + str(detail)) if detail and not ok else ''}", flush=True)
    PASSED += bool(ok)
    FAILED += not ok
    return ok


def curl(*args, data=None):
    cmd = ["curl", "-sS", "-m", "30", *args]
    p = subprocess.run(cmd, input=data, capture_output=True)
    return p.stdout


def api(base, path, method="GET", body=None):
    args = ["-X", method, base + path]
    if body is not None:
        args += ["-H", "Content-Type: application/json", "--data-binary", "@-"]
    out = curl(*args, data=body.encode() if isinstance(body, str) else body)
    return json.loads(out) if out else None


class System:
    def __init__(self, tmp):
        self.tmp, self.procs, self.coord = tmp, [], None
        self.state = os.path.join(tmp, "coord")

    def start_coordinator(self, ctl_port=0):
        ready = os.path.join(self.tmp, "ready.json")
        if os.path.exists(ready):
            os.unlink(ready)
        log = open(os.path.join(self.tmp, "coordinator.log"), "a")
        self.coord = subprocess.Popen([os.path.join(BUILD, "pipewright-coordinator"), "--http", "127.0.0.1:0",
                                       "--control", f"127.0.0.1:{ctl_port}", "--state-dir", self.state,
                                       "--ready-file", ready, "--heartbeat-timeout", "5", "--data-root", SRC],
                                      stdout=log, stderr=subprocess.STDOUT, cwd=SRC)
        for _ in range(200):
            if os.path.exists(ready):
                break
            time.sleep(0.05)
        ports = json.load(open(ready))
        self.base = f"http://127.0.0.1:{ports['http']}"
        self.ctl_port = ports["control"]
        return ports

    def start_worker(self, name, env=None):
        log = open(os.path.join(self.tmp, f"{name}.log"), "a")
        return subprocess.Popen(
            [os.path.join(BUILD, "pipewright-worker"), "--coordinator", f"127.0.0.1:{self.ctl_port}",
             "--listen", "127.0.0.1:0", "--name", name, "--state-dir", os.path.join(self.tmp, name)],
            stdout=log, stderr=subprocess.STDOUT, env=env)

    def start_workers(self, n, first=0):
        for i in range(first, first + n):
            self.procs.append(self.start_worker(f"w{i}"))

    def wait_workers(self, n, state="idle", timeout=30):
        t0 = time.time()
        while time.time() - t0 < timeout:
            ws = api(self.base, "/v1/workers")["workers"]
            if sum(w["state"] == state for w in ws) >= n:
                return True
            time.sleep(0.1)
        return False

    def wait_job(self, jid, states=("succeeded", "failed", "cancelled"), timeout=240):
        t0 = time.time()
        while time.time() - t0 < timeout:
            j = api(self.base, f"/v1/jobs/{jid}")
            if j and j.get("state") in states:
                return j
            time.sleep(0.2)
        return api(self.base, f"/v1/jobs/{jid}")

    def stop(self):
        for p in self.procs + ([self.coord] if self.coord else []):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs + ([self.coord] if self.coord else []):
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()


def submit(sys_, spec):
    out = curl("-X", "POST", "-H", "Content-Type: application/json", "--data-binary", "@-",
               "-D", os.path.join(sys_.tmp, "headers.txt"), sys_.base + "/v1/jobs", data=json.dumps(spec).encode())
    return json.loads(out)


def reference(tmp, spec, tag):
    path = os.path.join(tmp, f"ref-{tag}.json")
    json.dump(spec, open(path, "w"))
    subprocess.run([os.path.join(BUILD, "pipewright"), "train", "--job", path, "--quiet", "--log-json",
                    os.path.join(tmp, f"ref-{tag}.jsonl"), "--out", os.path.join(tmp, f"ref-{tag}.safetensors")],
                   check=True, cwd=SRC)
    return ([json.loads(l) for l in open(os.path.join(tmp, f"ref-{tag}.jsonl"))],
            st.load(os.path.join(tmp, f"ref-{tag}.safetensors"))[0])


def run_and_check(sys_, tmp, spec, tag):
    n = spec["mesh"]["pp"] * spec["mesh"].get("dp", 1)
    r = submit(sys_, spec)
    jid = r.get("id")
    if not check(f"{tag}: submitted (201 with an id)", isinstance(jid, int), r):
        return None
    hdr = open(os.path.join(sys_.tmp, "headers.txt")).read()
    check(f"{tag}: Location header", f"Location: /v1/jobs/{jid}" in hdr or f"location: /v1/jobs/{jid}" in hdr, hdr)
    j = sys_.wait_job(jid)
    if not check(f"{tag}: succeeded", j and j["state"] == "succeeded", j):
        return jid
    metrics = api(sys_.base, f"/v1/jobs/{jid}/metrics?since=0")["metrics"]
    steps = spec["train"]["steps"]
    check(f"{tag}: one metrics row per step", [m["step"] for m in metrics] == list(range(steps)),
          [m["step"] for m in metrics])
    check(f"{tag}: the loss fell", metrics[-1]["loss"] < metrics[0]["loss"] - 0.5,
          (metrics[0]["loss"], metrics[-1]["loss"]))
    ref_losses, ref_params = reference(tmp, spec, tag)
    worst_loss = max(abs(m["loss"] - e["loss"]) / abs(e["loss"]) for m, e in zip(metrics, ref_losses))
    check(f"{tag}: per-step losses equal the single-process run", worst_loss <= 1e-5, worst_loss)
    ck = os.path.join(tmp, f"{tag}.safetensors")
    subprocess.run(["curl", "-sS", "-f", "-o", ck, f"{sys_.base}/v1/jobs/{jid}/checkpoint"], check=False)
    if check(f"{tag}: checkpoint downloaded", os.path.exists(ck) and os.path.getsize(ck) > 0):
        got = st.load(ck)[0]
        same_names = set(got) == set(ref_params)
        worst = max((float(np.max(np.abs(np.asarray(got[k], np.float64) - ref_params[k])) /
                           (np.max(np.abs(ref_params[k])) + 1e-30)) for k in ref_params if k in got), default=1)
        check(f"{tag}: checkpoint equals the single-process parameters (1e-5)", same_names and worst <= 1e-5,
              (same_names, worst))
    # what SQLite recorded
    db = sqlite3.connect(os.path.join(sys_.state, "pipewright.db"))
    q = lambda sql, *a: db.execute(sql, a).fetchall()
    check(f"{tag}: store has the job", q("select state from jobs where id=?", jid) == [("succeeded",)])
    runs = q("select id from runs where job_id=?", jid)
    check(f"{tag}: store has the run", len(runs) == 1, runs)
    run = runs[0][0]
    check(f"{tag}: store has the partition",
          len(q("select stage from stages where run_id=?", run)) == spec["mesh"]["pp"] * spec["mesh"].get("virtual_stages", 1))
    acts = q("select rank, actions from actions where run_id=? order by rank", run)
    check(f"{tag}: store has every rank's action list", len(acts) == spec["mesh"]["pp"] and all(a[1] for a in acts), acts)
    check(f"{tag}: store has one metrics row per step", q("select count(*) from metrics where job_id=?", jid) == [(steps,)])
    ev = [e[0] for e in q("select message from events where job_id=? order by id", jid)]
    check(f"{tag}: events record the lifecycle", any("running" in e for e in ev) and any("succeeded" in e for e in ev), ev)
    check(f"{tag}: {n} workers idle again", sys_.wait_workers(n))
    db.close()
    return jid


class SliceCorrupter:
    """A proxy on one worker's control link: worker -> coordinator bytes pass
    as they are; coordinator -> worker messages are read whole, and while
    `corrupt` is set an assign's slice has one byte changed (its hash left
    as the coordinator computed it)."""

    def __init__(self, coord_port):
        self.coord_port, self.corrupt, self.corrupted = coord_port, True, 0
        self.lsock = socket.socket()
        self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(4)
        self.port = self.lsock.getsockname()[1]
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        while True:
            try:
                w, _ = self.lsock.accept()
            except OSError:
                return
            c = socket.create_connection(("127.0.0.1", self.coord_port))
            threading.Thread(target=self.pipe, args=(w, c), daemon=True).start()
            threading.Thread(target=self.to_worker, args=(c, w), daemon=True).start()

    @staticmethod
    def pipe(src, dst):
        try:
            while True:
                b = src.recv(65536)
                if not b:
                    break
                dst.sendall(b)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def to_worker(self, c, w):
        buf = b""
        try:
            while True:
                b = c.recv(65536)
                if not b:
                    break
                buf += b
                while len(buf) >= 4 and len(buf) >= 4 + struct.unpack(">I", buf[:4])[0]:
                    n = struct.unpack(">I", buf[:4])[0]
                    body, buf = buf[4:4 + n], buf[4 + n:]
                    m = json.loads(body)
                    if m.get("type") == "assign" and self.corrupt:
                        t = m["slice"]
                        i = t.index('"seed":"') + 8  # a digit of the seed: still valid JSON
                        m["slice"] = t[:i] + ("7" if t[i] != "7" else "8") + t[i + 1:]
                        body = json.dumps(m, separators=(",", ":")).encode()
                        self.corrupted += 1
                    w.sendall(struct.pack(">I", len(body)) + body)
        except OSError:
            pass
        for s in (c, w):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def corrupted_slice_checks(tmp):
    s = System(os.path.join(tmp, "slice"))
    os.makedirs(s.tmp)
    try:
        s.start_coordinator()
        proxy = SliceCorrupter(s.ctl_port)
        log = open(os.path.join(s.tmp, "w-proxied.log"), "a")
        s.procs.append(subprocess.Popen(
            [os.path.join(BUILD, "pipewright-worker"), "--coordinator", f"127.0.0.1:{proxy.port}",
             "--listen", "127.0.0.1:0", "--name", "w-proxied", "--state-dir", os.path.join(s.tmp, "w")],
            stdout=log, stderr=subprocess.STDOUT))
        check("slice: the proxied worker registered", s.wait_workers(1))
        one = {"name": "one-rank", "model": {"template": "gpt", "seq_len": 16, "d_model": 32, "n_layers": 2,
                                             "n_heads": 2},
               "mesh": {"pp": 1}, "schedule": {"name": "1f1b", "microbatches": 2},
               "train": {"steps": 3, "batch_size": 4, "optimizer": {"name": "adamw", "lr": 1e-3}},
               "data": {"kind": "copy"}}
        j = s.wait_job(submit(s, one)["id"], timeout=60)
        err = (j or {}).get("error") or ""
        check("slice: a changed slice fails the job", j and j["state"] == "failed" and proxy.corrupted == 1, j)
        check("slice: ... with a message naming the hash mismatch",
              "slice_sha256" in err and "hash mismatch" in err and "rank 0" in err, err)
        proxy.corrupt = False
        check("slice: the worker is idle again", s.wait_workers(1))
        j = s.wait_job(submit(s, one)["id"], timeout=120)
        check("slice: the same worker runs the job sent intact", j and j["state"] == "succeeded", j)
    finally:
        s.stop()
        check("slice: daemons exit cleanly", all(p.returncode == 0 for p in s.procs + [s.coord]),
              [p.returncode for p in s.procs + [s.coord]])


def kernel_checks(s):
    """Workers with OPENBLAS_CORETYPE=Haswell, Prescott (a stand-in for a CPU
    OpenBLAS does not know), Prescott with PW_GEMM=openblas, and unset: the
    products run on oneDNN wherever OpenBLAS's kernel is below the CPU
    (gemm.h), and only a slow kernel the products really run on carries the
    warning. They leave before any job: mixed paths would change the bits
    of a run."""
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "PW_GEMM")}
    procs = [s.start_worker("kh", dict(env, OPENBLAS_CORETYPE="Haswell")),
             s.start_worker("kp", dict(env, OPENBLAS_CORETYPE="Prescott")),
             s.start_worker("kf", dict(env, OPENBLAS_CORETYPE="Prescott", PW_GEMM="openblas")),
             s.start_worker("kn", env)]
    try:
        check("kernel: the workers registered", s.wait_workers(4))
        ws = {w["name"]: w for w in api(s.base, "/v1/workers")["workers"]}
        kh, kp, kf, kn = (ws.get(n, {}) for n in ("kh", "kp", "kf", "kn"))
        check("kernel: OPENBLAS_CORETYPE=Haswell is reported as forced",
              kh.get("blas_core") == "Haswell" and kh.get("blas_forced") is True, kh)
        check("kernel: without it OpenBLAS picks, not forced, no warning",
              kn.get("blas_core") and kn.get("blas_forced") is False and kn.get("warnings") == [], kn)
        check("kernel: every worker measured sgemm on its path",
              all((w.get("gemm_gflops") or 0) > 0 for w in (kh, kp, kf, kn)), (kh, kp, kf, kn))
        check("kernel: a Prescott kernel on this CPU: the products run on oneDNN, no warning",
              kp.get("blas_core") == "Prescott" and kp.get("gemm_path") == "onednn" and kp.get("warnings") == [], kp)
        level = kf.get("cpu_level")
        want = ("OpenBLAS kernel Prescott forced by OPENBLAS_CORETYPE; this CPU supports %s kernels (faster sgemm): "
                "unset it" % ("AVX-512" if level == "avx512" else "AVX2"))
        check("kernel: Prescott with PW_GEMM=openblas runs on it and carries the warning",
              kf.get("gemm_path") == "openblas" and kf.get("warnings") == [want], kf)
        check("kernel: Haswell runs on OpenBLAS only where it is the CPU's best",
              kh.get("gemm_path") == ("onednn" if level == "avx512" else "openblas") and kh.get("warnings") == [], kh)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=20)


def main():
    spec = json.load(open(os.path.join(SRC, "examples/jobs/gpt-pp4.json")))
    spec["model"]["n_layers"] = 4  # one block per stage: the example has 8 (two per stage, or V = 2)
    with tempfile.TemporaryDirectory(prefix="pw-coord-") as tmp:
        s = System(tmp)
        try:
            s.start_coordinator()
            check("healthz", api(s.base, "/healthz").get("status") == "ok")
            kernel_checks(s)
            s.start_workers(4)
            check("4 workers registered", s.wait_workers(4))
            ws = api(s.base, "/v1/workers")["workers"]
            check("every worker reports its BLAS kernel and a measured sgemm rate",
                  all(w["blas_core"] and isinstance(w["blas_forced"], bool) and w["cpu_level"] and
                      (w["gemm_gflops"] or 0) > 0 for w in ws if w["state"] == "idle"), ws)
            done_id = run_and_check(s, tmp, spec, "gpt-pp4-1f1b")
            for name, V in (("zb-h1", 1), ("interleaved-1f1b", 2)):
                sp = json.loads(json.dumps(spec))
                sp["name"] = f"gpt-pp2-{name}"
                sp["mesh"] = {"pp": 2, "dp": 1, "virtual_stages": V}
                sp["schedule"]["name"] = name
                run_and_check(s, tmp, sp, f"{name}-pp2")

            # jobs submitted back to back: each dispatched the moment the last
            # one frees its workers, every step of every one recorded
            tiny = {"name": "tiny", "model": {"template": "gpt", "seq_len": 16, "d_model": 32, "n_layers": 2,
                                              "n_heads": 2},
                    "mesh": {"pp": 2}, "schedule": {"name": "1f1b", "microbatches": 2},
                    "train": {"steps": 6, "batch_size": 4, "optimizer": {"name": "adamw", "lr": 1e-3}},
                    "data": {"kind": "text", "path": os.path.join(SRC, "examples/data/corpus.txt")}}
            ids = [submit(s, tiny)["id"] for _ in range(8)]
            finals = [s.wait_job(i) for i in ids]
            check("8 jobs back to back all succeed", all(j["state"] == "succeeded" for j in finals),
                  [(j["id"], j["state"], j.get("error")) for j in finals])
            check("... with every step recorded", all(j["progress"]["step"] == 6 and
                  len(api(s.base, f"/v1/jobs/{j['id']}/metrics?since=0")["metrics"]) == 6 for j in finals))

            # more ranks than workers: waits, says why, and can be cancelled
            big = json.loads(json.dumps(spec))
            big["name"] = "too-big"
            big["mesh"] = {"pp": 4, "dp": 2, "virtual_stages": 1}
            big["schedule"]["microbatches"] = 4
            bid = submit(s, big)["id"]
            time.sleep(1.5)
            j = api(s.base, f"/v1/jobs/{bid}")
            check("a job needing 8 workers waits", j["state"] == "queued" and "waiting for 8 idle workers" in
                  (j.get("status") or ""), j)
            # kill -9 with this job queued and another finished
            s.coord.send_signal(signal.SIGKILL)
            s.coord.wait()
            # meanwhile, the queued job is given sampled timings as a long
            # run's would be (0, 1, 2, then every 100th): the 404 for a step
            # not among them lists them compactly
            sampled = [0, 1, 2] + list(range(100, 5000, 100))
            db = sqlite3.connect(os.path.join(s.state, "pipewright.db"))
            db.executemany("insert into timings(job_id, step, rank, actions) values(?, ?, 0, ?)",
                           [(bid, k, "[[0, 0, 0, 0.0, 0.001]]") for k in sampled])
            db.commit()
            db.close()
            s.start_coordinator(ctl_port=s.ctl_port)
            e = (api(s.base, f"/v1/jobs/{bid}/timeline?step=5") or {}).get("error", {})
            check("timeline of a step not sampled: 404 naming the sampled steps, compactly",
                  e.get("code") == "not_found" and e.get("message") == f"step 5 of job {bid} was not sampled; "
                  "sampled steps: 0, 1, 2, 100, then every 100 steps to 4900", e)
            check("... and listing them all in error.sampled", e.get("sampled") == sampled, e.get("sampled"))
            db = sqlite3.connect(os.path.join(s.state, "pipewright.db"), timeout=30)  # a gap in the tail
            db.execute("delete from timings where job_id = ? and step in (700, 4000)", (bid,))
            db.commit()
            db.close()
            e = (api(s.base, f"/v1/jobs/{bid}/timeline?step=5") or {}).get("error", {})
            first = ", ".join(map(str, [k for k in sampled if k not in (700, 4000)][:20]))
            check("... an irregular list: the first 20, then the newest and how many",
                  e.get("message", "").endswith(f"sampled steps: {first}, ..., 4900 ({len(sampled) - 2} sampled)"), e)
            j = api(s.base, f"/v1/jobs/{bid}")
            check("after kill -9: the queued job is intact", j and j["state"] == "queued" and j["name"] == "too-big", j)
            j = api(s.base, f"/v1/jobs/{done_id}")
            check("after kill -9: the finished job is intact", j and j["state"] == "succeeded" and
                  j["progress"]["step"] == spec["train"]["steps"], j)
            m = api(s.base, f"/v1/jobs/{done_id}/metrics?since=0")["metrics"]
            check("after kill -9: its metrics are intact", len(m) == spec["train"]["steps"], len(m))
            check("after kill -9: the workers registered again on their own", s.wait_workers(4, timeout=30),
                  api(s.base, "/v1/workers"))
            r = api(s.base, f"/v1/jobs/{bid}", method="DELETE")
            check("cancel a queued job", r and r.get("state") == "cancelled", r)
            j = api(s.base, f"/v1/jobs/{bid}")
            check("cancelled job stays cancelled", j["state"] == "cancelled", j)
            r = api(s.base, f"/v1/jobs/{bid}", method="DELETE")
            check("cancel twice is a conflict", r and r.get("error", {}).get("code") == "conflict", r)
            corrupted_slice_checks(tmp)
        finally:
            s.stop()
            codes = [p.returncode for p in s.procs]
            check("workers exit cleanly on SIGTERM", all(c == 0 for c in codes), codes)
            check("coordinator exits cleanly on SIGTERM", s.coord.returncode == 0, s.coord.returncode)
            if FAILED:
                for f in sorted(os.listdir(tmp)):
                    if f.endswith(".log"):
                        print(f"--- {f} (tail)")
                        print("".join(open(os.path.join(tmp, f)).readlines()[-15:]))
    print(f"{PASSED} passed, {FAILED} failed")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())

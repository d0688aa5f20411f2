#!/usr/bin/env python3
"""driver: plays the coordinator's side of the control protocol, so the
worker runtime is tested with real worker processes on loopback before (and
independently of) the coordinator daemon.

It listens on 127.0.0.1 (ephemeral port), starts N pipewright-worker
processes pointed at it, welcomes them, plans the job with
`pipewright plan --json`, assigns rank r to worker r (its slice of the plan
from `pipewright plan --slices`, the peers' data addresses), and records what comes back: step reports,
checkpoints, done, errors. Optional chaos: kill one worker at a step, send
garbage control messages and data-plane bytes before the job.

Writes OUT/result.json and, when the run finished, OUT/merged.safetensors
(every stage's final checkpoint merged into one file, tied parameters taken
from their lowest stage)."""
import argparse, json, os, random, selectors, signal, socket, struct, subprocess, sys, time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ref"))
import st  # noqa: E402  (tests/ref/st.py: safetensors in pure Python)


def send_msg(sock, obj):
    body = json.dumps(obj, separators=(",", ":")).encode()
    sock.sendall(struct.pack(">I", len(body)) + body)


def control_exchange(port, msg, timeout=10):
    """Sends one control message to a coordinator's control port and
    returns its first answer ({} when the link closes first)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        send_msg(sock, msg)
        buf = b""
        while len(buf) < 4 or len(buf) < 4 + struct.unpack(">I", buf[:4])[0]:
            chunk = sock.recv(65536)
            if not chunk:
                break
            buf += chunk
    n = struct.unpack(">I", buf[:4])[0] if len(buf) >= 4 else 0
    return json.loads(buf[4:4 + n]) if len(buf) >= 4 + n and n else {}


def fill_disk(path):
    """Writes zeros to the file at path until its file system is full."""
    try:  # a disk already full is full
        with open(path, "wb") as f:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
    except OSError:
        pass


class Conn:
    def __init__(self, sock):
        self.sock, self.buf, self.info, self.rank = sock, b"", None, None

    def messages(self):
        out = []
        while len(self.buf) >= 4:
            n = struct.unpack(">I", self.buf[:4])[0]
            if len(self.buf) < 4 + n:
                break
            out.append(json.loads(self.buf[4:4 + n]))
            self.buf = self.buf[4 + n:]
        return out


def fuzz_data_plane(addr, seed):
    """Random, truncated and lying frames at a worker's data port."""
    rnd = random.Random(seed)
    host, port = addr.rsplit(":", 1)
    good_hdr = bytearray(64)
    good_hdr[0:4] = b"PWF1"
    cases = []
    for i in range(40):
        kind = i % 5
        if kind == 0:
            cases.append(bytes(rnd.getrandbits(8) for _ in range(rnd.randint(1, 300))))
        elif kind == 1:
            cases.append(bytes(good_hdr[: rnd.randint(1, 63)]))           # truncated header
        elif kind == 2:
            h = bytearray(good_hdr); h[4:6] = struct.pack("<H", 2); h[6:8] = struct.pack("<H", 2)
            h[52:56] = struct.pack("<I", 0xFFFFFFF0)                       # lying length, bad crc
            cases.append(bytes(h) + b"x" * 100)
        elif kind == 3:
            cases.append(b"PWF1" + bytes(rnd.getrandbits(8) for _ in range(200)))
        else:
            cases.append(b"")                                                 # connect and hang up
    for data in cases:
        try:
            s = socket.create_connection((host, int(port)), timeout=2)
            if data:
                s.sendall(data)
            s.close()
        except OSError:
            pass


def fuzz_control(conn, seed):
    """Malformed control messages on a registered worker's link: it must drop
    the link (and reconnect on its own), not crash."""
    rnd = random.Random(seed)
    choice = rnd.randint(0, 3)
    try:
        if choice == 0:
            conn.sock.sendall(struct.pack(">I", 0))
        elif choice == 1:
            conn.sock.sendall(struct.pack(">I", 1 << 30) + b"{")
        elif choice == 2:
            body = b"{not json"
            conn.sock.sendall(struct.pack(">I", len(body)) + body)
        else:
            send_msg(conn.sock, {"type": "assign", "job": "seven"})
    except OSError:
        pass


def proc_mem(pid):
    """[minor faults, VmRSS, VmData] of a process, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            flt = int(f.read().rsplit(")", 1)[1].split()[7])
        with open(f"/proc/{pid}/status") as f:
            st = {k: int(v.split()[0]) * 1024 for k, _, v in (ln.partition(":") for ln in f)
                  if k in ("VmRSS", "VmData")}
        return [flt, st.get("VmRSS", 0), st.get("VmData", 0)]
    except (OSError, ValueError, IndexError):
        return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--job", required=True)
    ap.add_argument("--build", required=True)
    ap.add_argument("--src", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--schedule")
    ap.add_argument("--trace-every", type=int, default=1)
    ap.add_argument("--kill-rank", type=int, default=-1)
    ap.add_argument("--kill-at-step", type=int, default=-1)
    ap.add_argument("--fuzz", action="store_true")
    ap.add_argument("--resume", help="checkpoint directory (stage-<s>.safetensors) to start from")
    ap.add_argument("--start-step", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--worker-arg", action="append", default=[], help="one more option for every worker")
    ap.add_argument("--http-url", help="welcome's http_url: where workers fetch datasets (data.dataset)")
    ap.add_argument("--settle-fds", type=float, default=0,
                    help="assign once every worker's heartbeat fds is steady; after the job, wait up to this many "
                         "seconds for each to come back to it (result: fds_before, fds_after)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    job = json.load(open(a.job))
    if job.get("data", {}).get("path") and not os.path.isabs(job["data"]["path"]):
        job["data"]["path"] = os.path.join(a.src, job["data"]["path"])
    if a.schedule:
        job["schedule"]["name"] = a.schedule
    spec_path = os.path.join(a.out, "job.json")
    json.dump(job, open(spec_path, "w"), indent=1)
    mesh = job.get("mesh", {})
    pp, dp, tp = mesh.get("pp", 1), mesh.get("dp", 1), mesh.get("tp", 1)
    n = pp * dp * tp
    plan = json.loads(subprocess.run([os.path.join(a.build, "pipewright"), "plan", "--job", spec_path, "--json"],
                                     check=True, capture_output=True, text=True).stdout)
    json.dump(plan, open(os.path.join(a.out, "plan.json"), "w"), indent=1)
    slices = json.loads(subprocess.run([os.path.join(a.build, "pipewright"), "plan", "--job", spec_path, "--slices"],
                                       check=True, capture_output=True, text=True).stdout)["slices"]

    lsock = socket.socket()
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(64)
    port = lsock.getsockname()[1]
    procs = []
    for i in range(n):
        log = open(os.path.join(a.out, f"w{i}.log"), "w")
        procs.append(subprocess.Popen(
            [os.path.join(a.build, "pipewright-worker"), "--coordinator", f"127.0.0.1:{port}",
             "--listen", "127.0.0.1:0", "--name", f"w{i}", "--state-dir", os.path.join(a.out, f"w{i}"),
             "--log-level", "info", *a.worker_arg], stdout=log, stderr=subprocess.STDOUT))

    sel = selectors.DefaultSelector()
    sel.register(lsock, selectors.EVENT_READ, None)
    conns, registered = [], {}
    result = {"losses": {}, "grad_norms": {}, "tokens": {}, "checkpoints": {}, "errors": [], "done": [],
              "peak_act": {}, "step_reports": 0, "actions": {}, "registrations": 0, "dp_bytes": {}, "vmhwm": {},
              "step_times": {}}
    deadline = time.time() + a.timeout
    assigned = fuzzed = killed = False
    last_step = job["train"]["steps"] - 1

    def assign_all():
        peers = [{"rank": r, "addr": registered[f"w{r}"].info["data_addr"],
                  "host": registered[f"w{r}"].info.get("host") or f"worker:w{r}"} for r in range(n)]
        for r in range(n):
            c = registered[f"w{r}"]
            c.rank = r
            send_msg(c.sock, {"type": "assign", "job": 1, "run": 1, "rank": r, "slice": slices[r]["slice"],
                              "slice_sha256": slices[r]["slice_sha256"], "peers": peers,
                              "steps": job["train"]["steps"],
                              "start_step": a.start_step, "checkpoint_dir": os.path.join(a.out, "ckpt"),
                              "trace_every": a.trace_every, **({"resume": a.resume} if a.resume else {})})

    def finished():
        if a.kill_rank >= 0 and killed:
            return len(result["errors"]) >= n - 1
        return len(result["done"]) == n or (result["errors"] and time.time() > err_deadline[0])

    err_deadline = [float("inf")]
    fds = {}  # worker name -> fds of its heartbeats, in order

    def fds_steady(name):
        h = fds.get(name, [])
        return len(h) >= 3 and h[-1] == h[-2] == h[-3] and h[-1] is not None

    def pump():
        nonlocal killed
        for key, _ in sel.select(timeout=0.2):
            if key.data is None:
                s, _ = lsock.accept()
                c = Conn(s)
                conns.append(c)
                sel.register(s, selectors.EVENT_READ, c)
                continue
            c = key.data
            try:
                data = c.sock.recv(1 << 20)
            except OSError:
                data = b""
            if not data:
                sel.unregister(c.sock)
                c.sock.close()
                continue
            c.buf += data
            for m in c.messages():
                t = m.get("type")
                if t == "register":
                    result["registrations"] += 1
                    c.info = m
                    registered[m["name"]] = c
                    send_msg(c.sock, {"type": "welcome", "version": 7, "worker_id": len(registered),
                                      "heartbeat_interval": 0.5, **({"http_url": a.http_url} if a.http_url else {})})
                elif t == "step":
                    result["step_reports"] += 1
                    k, r = str(m["step"]), m["rank"]
                    if "loss" in m:
                        result["losses"][k] = result["losses"].get(k, 0.0) + m["loss"]
                        result["tokens"][k] = result["tokens"].get(k, 0.0) + m.get("tokens", 0)
                    if "grad_norm" in m:
                        result["grad_norms"][k] = m["grad_norm"]
                    result["peak_act"][str(r)] = max(result["peak_act"].get(str(r), 0), m.get("peak_act", 0))
                    if "dp_bytes" in m:  # what the rank sent in the data-parallel exchange, per step
                        result["dp_bytes"].setdefault(str(r), {})[k] = m["dp_bytes"]
                    if "tp_bytes" in m:  # ... in the tensor-parallel all-reduces
                        result.setdefault("tp_bytes", {}).setdefault(str(r), {})[k] = m["tp_bytes"]
                    # a step takes as long as its slowest rank
                    result["step_times"][k] = max(result["step_times"].get(k, 0.0), m.get("step_time", 0.0))
                    # its worker's minor faults, VmRSS and VmData (bytes) as the report arrives
                    result.setdefault("mem", {}).setdefault(str(r), {})[k] = proc_mem(procs[r].pid)
                    if "actions" in m and m["step"] == 1:
                        result["actions"][str(r)] = m["actions"]
                        result.setdefault("trace", {})[str(r)] = dict(m.get("trace", {}), step_time=m["step_time"])
                    if a.kill_rank >= 0 and not killed and m["step"] >= a.kill_at_step:
                        procs[a.kill_rank].send_signal(signal.SIGKILL)
                        killed = True
                elif t == "checkpoint":
                    if m["step"] == job["train"]["steps"]:
                        result["checkpoints"][str(m["stage"])] = m["path"]
                elif t == "done":
                    result["done"].append(m["rank"])
                    try:  # the worker's peak resident memory so far (rank r runs on worker r)
                        with open(f"/proc/{procs[m['rank']].pid}/status") as f:
                            hwm = [ln for ln in f if ln.startswith("VmHWM:")]
                        result["vmhwm"][str(m["rank"])] = int(hwm[0].split()[1]) * 1024
                    except (OSError, IndexError):
                        pass
                elif t == "heartbeat":
                    fds.setdefault(c.info["name"] if c.info else "?", []).append(m.get("fds"))
                elif t == "error":
                    result["errors"].append(m)
                    if err_deadline[0] == float("inf"):
                        err_deadline[0] = time.time() + 10
    while time.time() < deadline and not (assigned and finished()):
        pump()
        if not assigned and len(registered) == n and (not a.settle_fds or all(map(fds_steady, registered))):
            if a.fuzz and not fuzzed:
                fuzzed = True
                for i, (name, c) in enumerate(sorted(registered.items())):
                    fuzz_data_plane(c.info["data_addr"], i)
                fuzz_control(registered["w0"], 7)
                registered.pop("w0")      # it drops the link and registers again
                continue
            fds_at_assign = {name: fds.get(name, [None])[-1] for name in registered}
            assign_all()
            assigned = True

    result["timed_out"] = not (assigned and finished())
    if a.settle_fds and assigned:
        result["fds_before"] = before = fds_at_assign
        seen = {name: len(fds[name]) for name in before}
        settle_end = time.time() + a.settle_fds
        while time.time() < settle_end and not all(len(fds[k]) > seen[k] and fds[k][-1] == v
                                                     for k, v in before.items()):
            pump()
        result["fds_after"] = {name: fds[name][-1] for name in before}
    for c in list(registered.values()):
        try:
            send_msg(c.sock, {"type": "shutdown"})
        except OSError:
            pass
    codes = []
    for i, p in enumerate(procs):
        if i == a.kill_rank and killed:
            p.wait()
            codes.append(None)
            continue
        try:
            codes.append(p.wait(timeout=30))
        except subprocess.TimeoutExpired:
            p.kill()
            codes.append("hung")
    result["exit_codes"] = codes
    if len(result["done"]) == n and result["checkpoints"]:
        merged, seen = {}, set()
        for s in sorted(result["checkpoints"], key=int):
            for name, arr in st.load(result["checkpoints"][s])[0].items():
                if name not in seen:
                    seen.add(name)
                    merged[name] = arr
        st.save(os.path.join(a.out, "merged.safetensors"), merged)
        result["merged"] = os.path.join(a.out, "merged.safetensors")
    json.dump(result, open(os.path.join(a.out, "result.json"), "w"), indent=1)
    ok = not result["timed_out"] and (a.kill_rank >= 0 or (len(result["done"]) == n and not result["errors"]))
    print(f"driver: {'ok' if ok else 'FAILED'}: done {sorted(result['done'])}, errors {len(result['errors'])}, "
          f"exit codes {codes}, timed out {result['timed_out']}")
    for e in result["errors"]:
        print("  error from rank", e.get("rank"), ":", e.get("message"))
    return 0 if ok else 1



# ---------------------------------------------------------------------------
# A real coordinator and real workers on loopback (test_recovery, test_chaos):
# processes started with ephemeral ports in a temp dir, killed, stopped and
# continued by their pid, every one of them killed at exit.

import atexit, struct as _struct, urllib.error, urllib.request  # noqa: E402

_LIVE = []  # every Popen started here, killed at exit (whatever the test did)


def _kill_all():
    for p in _LIVE:
        if p.poll() is None:
            try:
                p.send_signal(signal.SIGCONT)
                p.kill()
                p.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                pass


def _track(p):
    """Remember p; the first call makes SIGTERM/SIGINT/SIGHUP exit through atexit."""
    if not _LIVE:
        atexit.register(_kill_all)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, lambda s, f: sys.exit(128 + s))
    _LIVE.append(p)
    return p


class Checks:
    """check(label, ok, detail): prints an ok/FAIL line, counts it, returns ok."""

    def __init__(self):
        self.passed = self.failed = 0

    def __call__(self, label, ok, detail=""):
        print(f"{'ok  ' if ok else 'FAIL'} {label}{(': ' + str(detail)[:600]) if detail and not ok else ''}", flush=True)
        self.passed += bool(ok)
        self.failed += not ok
        return ok


def http(base, path, method="GET", body=None, raw=False, timeout=60):
    """(status, parsed JSON | text), or the bytes with raw=True and a 200."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, out = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, out = e.code, e.read()
    except (urllib.error.URLError, OSError) as e:
        return 0, str(e)
    if raw and status == 200:
        return status, out
    try:
        return status, json.loads(out)
    except ValueError:
        return status, out.decode(errors="replace")


def wait_for(pred, timeout=60, every=0.1):
    """pred()'s first true value within timeout seconds, else its last."""
    end = time.time() + timeout
    while time.time() < end:
        v = pred()
        if v:
            return v
        time.sleep(every)
    return pred()


def st_tensors(blob):
    """{name: (dtype, shape, bytes)} of a safetensors file's bytes."""
    n = _struct.unpack("<Q", blob[:8])[0]
    hdr = json.loads(blob[8:8 + n])
    hdr.pop("__metadata__", None)
    base = 8 + n
    return {k: (v["dtype"], v["shape"], blob[base + v["data_offsets"][0]:base + v["data_offsets"][1]])
            for k, v in hdr.items()}


def bit_diff(got, ref):
    """'' when two safetensors blobs hold the same tensors bit for bit, else
    what differs (names, then the first tensors whose bytes differ)."""
    if not isinstance(got, bytes) or not isinstance(ref, bytes):
        return f"no file: {type(got).__name__} {str(got)[:200]}"
    a, b = st_tensors(got), st_tensors(ref)
    if a.keys() != b.keys():
        return f"tensor names differ: only cluster {sorted(a.keys() - b.keys())[:5]}, " \
               f"only single {sorted(b.keys() - a.keys())[:5]}"
    bad = sorted(k for k in b if a[k] != b[k])
    return f"{len(bad)} of {len(b)} tensors differ: {bad[:5]}" if bad else ""


def tiny_gpt(name, steps, seed, src):
    """A pp 2 GPT of d 32, 2 layers, seq 32 on the example corpus (random
    sampler), one checkpoint at its end: a job whose steps take
    milliseconds, for tests that act on a run mid-way."""
    return {"name": name,
            "model": {"template": "gpt", "vocab_size": 256, "seq_len": 32, "d_model": 32, "n_layers": 2,
                      "n_heads": 2, "tie_embeddings": False},
            "mesh": {"pp": 2, "dp": 1}, "schedule": {"name": "1f1b", "microbatches": 2},
            "train": {"steps": steps, "batch_size": 4, "seed": seed, "grad_clip": 1.0, "checkpoint_every": 0,
                      "optimizer": {"name": "adamw", "lr": 3e-3, "min_lr": 3e-4, "warmup_steps": 5,
                                    "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
            "data": {"kind": "text", "path": os.path.join(src, "examples/data/corpus.txt"), "sampler": "random"}}


def train_reference(build, spec, tmp, tag, nice=0):
    """`pipewright train --job F --out X` of spec: X's bytes (cached per tag;
    nice > 0: at that niceness, to use what CPU a cluster leaves)."""
    out = os.path.join(tmp, f"ref-{tag}.safetensors")
    if not os.path.exists(out):
        f = os.path.join(tmp, f"ref-{tag}.json")
        json.dump(spec, open(f, "w"), indent=1)
        subprocess.run((["nice", "-n", str(nice)] if nice else []) +
                       [os.path.join(build, "pipewright"), "train", "--job", f, "--out", out, "--quiet"],
                       check=True, env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
    return open(out, "rb").read()


def attempts(c, jid):
    """GET /v1/jobs/{id}'s attempts, oldest first: [{attempt, run, state,
    started, finished, reason, start_step, resumed_from, workers}]."""
    return c.job(jid).get("attempts") or []


def all_metrics(c, jid):
    """Every metrics row of every run of the job."""
    st_, r = http(c.base, f"/v1/jobs/{jid}/metrics?since=0&all=1")
    return r.get("metrics", []) if st_ == 200 and isinstance(r, dict) else []


def stop_checked(c, check):
    """Stops a cluster: every daemon must exit 0 on SIGTERM with no
    sanitizer report in its log."""
    rc = c.stop()
    check("on SIGTERM the coordinator and every worker exit with 0", all(v == 0 for v in rc.values()), rc)
    check("no sanitizer report in any log", not c.sanitizer_reports(), c.sanitizer_reports()[:5])


def keep_or_remove(tmp, failed):
    """When a test failed, the tails of the logs in tmp printed and tmp
    kept; else tmp removed."""
    import shutil
    if failed:
        for f in sorted(os.listdir(tmp)):
            if f.endswith(".log"):
                print(f"--- {f} (tail)")
                print("".join(open(os.path.join(tmp, f), errors="replace").readlines()[-12:]))
        print(f"logs kept in {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)


def finish(tmp, check):
    """A test's end: its count, its logs kept or removed; the exit status."""
    print(f"{check.passed} passed, {check.failed} failed")
    keep_or_remove(tmp, check.failed)
    return 1 if check.failed else 0


def close_cluster(c, tmp, check, failed):
    """Stops a test's cluster (stop_checked); when anything failed
    (failed() after those checks) the logs' tails are printed and tmp is
    kept, else removed."""
    stop_checked(c, check)
    keep_or_remove(tmp, failed())


class Cluster:
    """A coordinator (restartable on its state dir) and named workers."""

    def __init__(self, build, tmp, tag, args=(), data_root=None):
        self.build, self.tmp, self.tag, self.args, self.data_root = build, tmp, tag, list(args), data_root
        self.state = os.path.join(tmp, tag + "-coord")
        self.log = os.path.join(tmp, tag + "-coordinator.log")
        self.coord, self.workers = None, {}  # name -> Popen
        self.worker_args = []  # more options for every worker (tests/gpu: --device cuda)
        self.killed = set()  # names of workers killed on purpose (since their last start)
        self.http_port = self.ctl = 0
        self.start_coordinator()

    def start_coordinator(self):
        """Starts it; a restart takes the ports of the first start (the
        workers know that control address)."""
        ready = os.path.join(self.tmp, self.tag + "-ready.json")
        if os.path.exists(ready):
            os.unlink(ready)
        extra = ["--data-root", self.data_root] if self.data_root else []
        self.coord = subprocess.Popen([os.path.join(self.build, "pipewright-coordinator"),
                                       "--http", f"127.0.0.1:{self.http_port}", "--control", f"127.0.0.1:{self.ctl}",
                                       "--state-dir", self.state, "--ready-file", ready,
                                       *extra, *self.args],
                                      stdout=open(self.log, "a"), stderr=subprocess.STDOUT,
                                      env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
        _track(self.coord)
        if not wait_for(lambda: os.path.exists(ready) and os.path.getsize(ready) > 0 or self.coord.poll() is not None,
                        30, 0.05) or self.coord.poll() is not None:
            raise RuntimeError(f"the coordinator did not start: {self.log_text()[-800:]}")
        time.sleep(0.05)
        ports = json.load(open(ready))
        self.http_port, self.ctl = ports["http"], ports["control"]
        self.base = f"http://127.0.0.1:{self.http_port}"

    def kill_coordinator(self):
        self.coord.kill()
        self.coord.wait()

    def worker_log(self, name):
        return os.path.join(self.tmp, f"{self.tag}-{name}.log")

    def start_worker(self, name):
        p = subprocess.Popen([os.path.join(self.build, "pipewright-worker"), "--coordinator", f"127.0.0.1:{self.ctl}",
                              "--listen", "127.0.0.1:0", "--name", name,
                              "--state-dir", os.path.join(self.tmp, f"{self.tag}-{name}"), *self.worker_args],
                             stdout=open(self.worker_log(name), "a"), stderr=subprocess.STDOUT,
                             env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
        _track(p)
        self.workers[name] = p
        self.killed.discard(name)
        return p

    def signal_worker(self, name, sig, wait=True):
        if sig == signal.SIGKILL:
            self.killed.add(name)
        self.workers[name].send_signal(sig)
        if sig == signal.SIGKILL and wait:
            self.workers[name].wait()

    def crashed(self):
        """{name: exit status} of the workers that exited without being
        killed on purpose (a crash: -6 an abort, -11 a segfault)."""
        return {n: p.returncode for n, p in self.workers.items() if p.poll() is not None and n not in self.killed}

    def worker_rows(self):
        st_, r = http(self.base, "/v1/workers")
        return r.get("workers", []) if st_ == 200 and isinstance(r, dict) else []

    def idle(self):
        return sorted(w["name"] for w in self.worker_rows() if w.get("state") == "idle")

    def wait_idle(self, n, timeout=30):
        return wait_for(lambda: len(self.idle()) >= n, timeout)

    def submit(self, spec):
        st_, r = http(self.base, "/v1/jobs", "POST", spec)
        if st_ not in (200, 201):
            raise RuntimeError(f"submit: {st_} {r}")
        return r["id"]

    def job(self, jid):
        st_, r = http(self.base, f"/v1/jobs/{jid}")
        return r if st_ == 200 and isinstance(r, dict) else {}

    def step(self, jid):
        return (self.job(jid).get("progress") or {}).get("step") or 0

    def wait_job(self, jid, timeout=180, states=("succeeded", "failed", "cancelled")):
        return wait_for(lambda: (lambda j: j if j.get("state") in states else None)(self.job(jid)), timeout, 0.2) \
            or self.job(jid)

    def events(self, jid):
        st_, r = http(self.base, f"/v1/jobs/{jid}/events?since=0")
        return r.get("events", []) if st_ == 200 and isinstance(r, dict) else []

    def checkpoint(self, jid):
        st_, data = http(self.base, f"/v1/jobs/{jid}/checkpoint", raw=True)
        return data if st_ == 200 else f"{st_}: {data}"

    def ranks(self, jid):
        """[worker name by rank] of the job's current run."""
        rk = sorted(self.job(jid).get("ranks") or [], key=lambda x: x["rank"])
        return [x.get("worker") for x in rk]

    def sanitizer_reports(self):
        """[(log file, line)] of every AddressSanitizer / LeakSanitizer /
        UBSan report in the coordinator's and the workers' logs."""
        out = []
        for f in sorted(os.listdir(self.tmp)):
            if f.startswith(self.tag + "-") and f.endswith(".log"):
                for line in open(os.path.join(self.tmp, f), errors="replace"):
                    if any(b in line for b in ("AddressSanitizer", "LeakSanitizer", "runtime error:")):
                        out.append((f, line.strip()[:300]))
        return out

    def log_text(self):
        return open(self.log, errors="replace").read() if os.path.exists(self.log) else ""

    def stop(self):
        """SIGTERM to everything; {"coordinator" | worker name: exit status}
        of those that were running (None: hung, killed)."""
        procs = {n: p for n, p in [*self.workers.items(), ("coordinator", self.coord)] if p and p.poll() is None}
        for p in procs.values():
            p.send_signal(signal.SIGCONT)
            p.send_signal(signal.SIGTERM)
        out = {}
        for n, p in procs.items():
            try:
                out[n] = p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                out[n] = None
        return out


if __name__ == "__main__":
    sys.exit(main())

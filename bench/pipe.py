"""pipe: drives real pipewright-worker processes for the harness (cases 2 pp=2, 3, 4, 6).

Plays the coordinator's side of the control protocol like
tests/integration/driver.py (which it follows), but keeps every step report
(step_time, peak_act, the traced actions), the wall-clock time each step's
last report arrived, and, at each report, the reporting worker's minor page
faults, RSS, data-segment size and VmHWM (peak RSS so far) from
/proc/PID/{stat,status}. Also: replay(), a Python copy of common/plan/sim.h's
execution model, to replay a plan with measured per-action costs."""
import json, os, selectors, socket, struct, subprocess, time


def _send(sock, obj):
    body = json.dumps(obj, separators=(",", ":")).encode()
    sock.sendall(struct.pack(">I", len(body)) + body)


def _proc(pid):
    with open(f"/proc/{pid}/stat") as f:
        minflt = int(f.read().rsplit(")", 1)[1].split()[7])
    st = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM", "VmData"):
                st[k] = int(v.split()[0]) * 1024
    return minflt, st


def plan(build, spec_path):
    return json.loads(subprocess.run([os.path.join(build, "pipewright"), "plan", "--job", spec_path, "--json"],
                                     check=True, capture_output=True, text=True).stdout)


def run(build, job, out, trace_every=1, env=None, timeout=300, worker_args=()):
    """Runs job (a dict) on pp*dp*tp fresh workers; returns a dict with plan, per-rank step reports and samples."""
    os.makedirs(out, exist_ok=True)
    spec_path = os.path.join(out, "job.json")
    with open(spec_path, "w") as f:
        json.dump(job, f, indent=1)
    pl = plan(build, spec_path)
    slices = json.loads(subprocess.run([os.path.join(build, "pipewright"), "plan", "--job", spec_path, "--slices"],
                                       check=True, capture_output=True, text=True).stdout)["slices"]
    pp = job["mesh"].get("pp", 1) * job["mesh"].get("dp", 1) * job["mesh"].get("tp", 1)
    lsock = socket.socket()
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(16)
    port = lsock.getsockname()[1]
    procs = []
    for i in range(pp):
        log = open(os.path.join(out, f"w{i}.log"), "w")
        procs.append(subprocess.Popen(
            [os.path.join(build, "pipewright-worker"), "--coordinator", f"127.0.0.1:{port}", "--listen",
             "127.0.0.1:0", "--name", f"w{i}", "--state-dir", os.path.join(out, f"w{i}"), "--log-level", "warn",
             *worker_args],
            stdout=log, stderr=subprocess.STDOUT, env=env))
    sel = selectors.DefaultSelector()
    sel.register(lsock, selectors.EVENT_READ, None)
    reg, bufs = {}, {}
    res = {"plan": pl, "reports": [[] for _ in range(pp)], "step_wall": {}, "errors": [], "done": []}
    steps = job["train"]["steps"]
    deadline = time.time() + timeout
    assigned = False
    try:
        while time.time() < deadline and not (assigned and (len(res["done"]) == pp or res["errors"])):
            for key, _ in sel.select(timeout=0.2):
                if key.data is None:
                    s, _ = lsock.accept()
                    bufs[s] = b""
                    sel.register(s, selectors.EVENT_READ, s)
                    continue
                s = key.data
                data = s.recv(1 << 20)
                if not data:
                    sel.unregister(s)
                    continue
                bufs[s] += data
                while len(bufs[s]) >= 4:
                    n = struct.unpack(">I", bufs[s][:4])[0]
                    if len(bufs[s]) < 4 + n:
                        break
                    m = json.loads(bufs[s][4:4 + n])
                    bufs[s] = bufs[s][4 + n:]
                    t = m.get("type")
                    if t == "register":
                        reg[m["name"]] = (s, m)
                        _send(s, {"type": "welcome", "version": m["version"], "worker_id": len(reg),
                                  "heartbeat_interval": 0.5})
                    elif t == "step":
                        r = m["rank"]
                        flt, st = _proc(procs[r].pid)
                        m["minflt"], m["rss"], m["vmdata"] = flt, st.get("VmRSS", 0), st.get("VmData", 0)
                        res["reports"][r].append(m)
                        res["step_wall"][m["step"]] = time.time()
                        m["hwm"] = st.get("VmHWM", 0)  # the peak so far (the last step's: remat.py)
                    elif t == "done":
                        res["done"].append(m["rank"])
                    elif t == "error":
                        res["errors"].append(m.get("message"))
            if not assigned and len(reg) == pp:
                peers = [{"rank": r, "addr": reg[f"w{r}"][1]["data_addr"],
                          "host": reg[f"w{r}"][1].get("host") or f"worker:w{r}"} for r in range(pp)]
                for r in range(pp):
                    _send(reg[f"w{r}"][0], {
                        "type": "assign", "job": 1, "run": 1, "rank": r, "slice": slices[r]["slice"],
                        "slice_sha256": slices[r]["slice_sha256"], "peers": peers,
                        "steps": steps, "start_step": 0, "checkpoint_dir": os.path.join(out, "ckpt"),
                        "trace_every": trace_every})
                assigned = True
    finally:
        for s, _ in reg.values():
            try:
                _send(s, {"type": "shutdown"})
            except OSError:
                pass
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        lsock.close()
    if res["errors"] or len(res["done"]) != pp:
        raise RuntimeError(f"pipeline run in {out} failed: errors {res['errors'][:2]}, done {res['done']}")
    return res


def step_period(res, warmup):
    """Median wall time between consecutive steps' last reports, after warmup steps."""
    w = res["step_wall"]
    ks = sorted(k for k in w if k >= warmup)
    d = sorted(w[b] - w[a] for a, b in zip(ks, ks[1:]))
    return d[len(d) // 2] if d else None


def _parse(tok):
    kind = tok[0]
    mb, st = tok[1:].split("@s")
    return kind, int(mb), int(st)


def replay(plan_obj, cost):
    """common/plan/sim.h's model with zero transfer cost: rank lists run in order,
    a fused pair (A+B) as one unit; F k@s needs F k@s-1; B/I k@s needs F k@s
    and B/I k@s+1 (the last stage: its F); W needs I. cost(kind, mb, stage)
    gives seconds. Returns makespan, bubble ratio, per-rank busy and end."""
    p = plan_obj
    S, pp = p["stages"], p["pp"]
    lists = [[[_parse(a) for a in u.split("+")] for u in r.split()] for r in p["ranks"]]
    done = {}
    pc, free = [0] * pp, [0.0] * pp
    busy = [0.0] * pp
    progress = True
    while progress:
        progress = False
        for r in range(pp):
            while pc[r] < len(lists[r]):
                unit = lists[r][pc[r]]
                ready = free[r]
                ok = True
                for kind, mb, st in unit:
                    if kind == "F":
                        deps = [("F", mb, st - 1)] if st > 0 else []
                    elif kind in "BI":
                        deps = [("F", mb, st)] + ([("G", mb, st + 1)] if st < S - 1 else [])
                    else:
                        deps = [("I", mb, st)]
                    for d in deps:
                        if d in done:
                            ready = max(ready, done[d])
                        elif not any((k == d[0] or (d[0] == "G" and k in "BI")) and m == d[1] and s == d[2]
                                     for k, m, s in unit):
                            ok = False
                if not ok:
                    break
                c = sum(cost(k, m, s) for k, m, s in unit)
                end = ready + c
                busy[r] += c
                for k, m, s in unit:
                    done[(k, m, s)] = end
                    if k in "BI":
                        done[("G", m, s)] = end
                free[r] = end
                pc[r] += 1
                progress = True
    if any(pc[r] < len(lists[r]) for r in range(pp)):
        raise RuntimeError("replay deadlocked")
    mk = max(free)
    return {"makespan": mk, "bubble_ratio": sum(mk - b for b in busy) / (pp * mk) if mk else 0.0,
            "busy": busy, "end": free}


def action_costs(res, warmup):
    """Median measured duration per (kind, stage) over traced steps after warmup."""
    d = {}
    for rep in res["reports"]:
        for m in rep:
            if m["step"] < warmup or "actions" not in m:
                continue
            for kind, mb, st, t0, t1 in m["actions"]:
                d.setdefault((kind, st), []).append(t1 - t0)
    return {k: sorted(v)[len(v) // 2] for k, v in d.items()}


def measured_bubble(res, warmup):
    """Per traced step: 1 - sum of action time over ranks / (pp * latest action end); median over steps.
    Each rank's times count from its own step start (the ranks start a step within a wake-up of each other)."""
    pp = len(res["reports"])
    by_step = {}
    for r, rep in enumerate(res["reports"]):
        for m in rep:
            if m["step"] >= warmup and "actions" in m:
                by_step.setdefault(m["step"], {})[r] = m["actions"]
    out = []
    for k, ranks in by_step.items():
        if len(ranks) != pp:
            continue
        busy = sum(t1 - t0 for acts in ranks.values() for _, _, _, t0, t1 in acts)
        end = max(a[4] for acts in ranks.values() for a in acts)
        out.append(1 - busy / (pp * end))
    out.sort()
    return out[len(out) // 2] if out else None

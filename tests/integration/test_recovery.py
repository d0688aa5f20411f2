#!/usr/bin/env python3
"""test_recovery: a job survives losing workers (issue 15) — one real
coordinator (--heartbeat-timeout 2) and five real workers on loopback, a
pp=4 GPT (four ranks and a spare) trained on the example corpus with the
random sampler.

  1. kill -9 of a rank mid-run, snapshot_every 1, before the first
     checkpoint (checkpoint_every 25): a worker_lost event names the
     worker, its address and rank; the job resumes on the spare from the
     snapshots in worker memory at most 1 step before the loss (never
     after it); it succeeds and its checkpoint equals `pipewright train`'s
     bit for bit.
  2. The same with snapshot_every 0, checkpoint_every 3: it resumes from the
     coordinator's checkpoint, at most 3 steps back, bit for bit.
  3. SIGSTOP of a rank: lost within heartbeat-timeout + 3 s, recovered the
     same way; SIGCONT: the worker comes back idle, its late messages
     change nothing (no row of its old run after the loss), bit for bit.
  4. A rank and its snapshot holder (rank r+1) killed together: the job
     resumes from the checkpoint (at least as new as the newest one listed
     before the kill) once the two are restarted; bit for bit.
  5. The coordinator kill -9'd right after a worker is lost and started
     again on its state dir: the job still ends bit for bit.
  6. A second worker with a name that is registered is refused with an
     error in its log; the first keeps its registration.
  7. max_restarts 0: losing a worker fails the job, the error names it;
     max_restarts 1 and two losses: the job fails naming both.

Every case: steps recorded by two attempts have the same loss, every step
has its metrics row; no worker exits unless killed (a crash); the store
(the API's attempts, else the runs table) holds every attempt, the
interrupted one(s) first. Prints the measured detection and recovery
times (loss -> first step of the next attempt recorded).

Bit for bit = every tensor's dtype, shape and bytes (the files' metadata
differ: the cluster's spec names the dataset, train's the path).
Seeded (PW_TEST_SEED, else the time; printed). Under PW_SANITIZE=ON the
jobs are shorter. Usage: test_recovery.py BUILD_DIR SOURCE_DIR"""
import os, random, re, signal, subprocess, sys, tempfile, threading, time

BUILD, SRC = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import driver as d  # noqa: E402  (Cluster, http, wait_for, bit_diff, train_reference)

SANITIZE = os.environ.get("PW_SANITIZE", "OFF") == "ON"
STEPS = 40 if SANITIZE else 80
HB = 2                      # --heartbeat-timeout
CE = 25                     # checkpoint_every (part 2: 3): parts 1 and 3 lose a worker before step CE
SLOW = 3 if SANITIZE else 1  # time bounds (not assertions on speed) scale with the build
NAMES = [f"w{i}" for i in range(5)]
SEED = int(os.environ.get("PW_TEST_SEED") or time.time() * 1000 % 1000000)
RND = random.Random(SEED)
PASSED = FAILED = 0
TIMES = []  # (part, detection s, recovery s)

LOST_RE = re.compile(r"^worker (\S+) \((\S+), rank (\d+)\) lost at step (\d+): (.+)$")
RESUME_RE = re.compile(r"^attempt (\d+) (?:resumes at step (\d+) from (snapshots in worker memory|the checkpoint of step "
                       r"(\d+))|starts at step 0)$")


def check(label, ok, detail=""):
    global PASSED, FAILED
    print(f"{'ok  ' if ok else 'FAIL'} {label}{(': ' + str(detail)[:900]) if detail and not ok else ''}", flush=True)
    PASSED += bool(ok)
    FAILED += not ok
    return ok


def spec(name, steps=STEPS, **train):
    t = {"steps": steps, "batch_size": 16, "seed": 7, "grad_clip": 1.0, "checkpoint_every": CE,
         "keep_checkpoints": 3, "snapshot_every": 1, "max_restarts": 3,
         "optimizer": {"name": "adamw", "lr": 3e-3, "min_lr": 3e-4, "warmup_steps": 5, "betas": [0.9, 0.95],
                       "eps": 1e-8, "weight_decay": 0.1}}
    t.update(train)
    return {"name": name,
            "model": {"template": "gpt", "vocab_size": 256, "seq_len": 64, "d_model": 64, "n_layers": 4,
                      "n_heads": 4, "tie_embeddings": False},
            "mesh": {"pp": 4, "dp": 1}, "schedule": {"name": "1f1b", "microbatches": 4},
            "train": t,
            "data": {"kind": "text", "path": os.path.join(SRC, "examples/data/corpus.txt"), "sampler": "random"}}


# ---------------------------------------------------------------------------
# what the coordinator says


def lost_events(c, jid):
    """[{name, addr, rank, step, cause, time}] of the job's worker_lost events."""
    out = []
    for e in c.events(jid):
        if e.get("kind") == "worker_lost":
            m = LOST_RE.match(e.get("message", ""))
            out.append({"name": m.group(1), "addr": m.group(2), "rank": int(m.group(3)), "step": int(m.group(4)),
                        "cause": m.group(5), "time": e["time"]} if m else {"bad": e["message"], "time": e["time"]})
    return out


def resume_events(c, jid):
    """[{attempt, step, from: snapshot|checkpoint|start, ckpt, time}] of the job's resume events."""
    out = []
    for e in c.events(jid):
        if e.get("kind") == "resume":
            m = RESUME_RE.match(e.get("message", ""))
            if not m:
                out.append({"bad": e["message"], "time": e["time"]})
                continue
            kind = "start" if m.group(2) is None else "snapshot" if m.group(3).startswith("snapshots") else "checkpoint"
            out.append({"attempt": int(m.group(1)), "step": int(m.group(2) or 0), "from": kind,
                        "ckpt": int(m.group(4)) if m.group(4) else None, "time": e["time"]})
    return out


def checkpoint_steps(c, jid):
    st_, r = d.http(c.base, f"/v1/jobs/{jid}/checkpoints")
    return [x["step"] for x in r.get("checkpoints", [])] if st_ == 200 and isinstance(r, dict) else []


# ---------------------------------------------------------------------------
# driving it


def ensure_workers(c, tag):
    """No worker exited unless killed; every worker alive (a dead one
    started again under its name), none stopped, all idle."""
    crashed = c.crashed()
    check(f"{tag}: no worker exited unless killed", not crashed,
          {n: f"exit status {rc}" + (" (abort)" if rc == -6 else " (segfault)" if rc == -11 else "")
           for n, rc in crashed.items()})
    for n in NAMES:
        p = c.workers.get(n)
        if p is None or p.poll() is not None:
            c.start_worker(n)
        else:
            p.send_signal(signal.SIGCONT)
    return d.wait_for(lambda: set(NAMES) <= set(c.idle()), 40 * SLOW, 0.1)


def addrs(c):
    return {w["name"]: w["addr"] for w in c.worker_rows()}


def running_at(c, jid, step):
    """Waits until the job is running with at least `step` steps recorded;
    (observed step, ranks -> worker names) then, or (None, why)."""
    j = d.wait_for(lambda: (lambda j: j if j.get("state") == "running" and
                            (j.get("progress") or {}).get("step", 0) >= step else None)(c.job(jid)), 60 * SLOW, 0.01)
    if not j:
        return None, c.job(jid)
    return j["progress"]["step"], [x["worker"] for x in sorted(j["ranks"], key=lambda x: x["rank"])]


def first_row_after(c, jid, old_runs, t0, timeout):
    """Time of the first metrics row of a run not in old_runs (the next
    attempt's first step recorded), by the coordinator's clock."""
    def got():
        rows = [m["time"] for m in d.all_metrics(c, jid) if m.get("run") not in old_runs and m.get("time")]
        if rows:
            return min(rows)
        return -1 if c.job(jid).get("state") in ("succeeded", "failed", "cancelled") else None
    t = d.wait_for(got, timeout, 0.02)
    return t if t and t > 0 else None


def common_checks(tag, c, jid, sp, n_losses=(1, 1), ref=None, coord_restart=False):
    """The end of every recovered job: succeeded, bit for bit, an attempt
    per loss (n_losses: the fewest and most) plus the last, repeated steps
    with the same loss. coord_restart: an attempt may also have been ended
    by the coordinator's restart (that costs the job no restart)."""
    # (a worker that crashed leaves the job queued for want of workers: no use waiting)
    j = d.wait_for(lambda: (lambda j: j if j.get("state") in ("succeeded", "failed", "cancelled") or
                            (j.get("state") == "queued" and c.crashed()) else None)(c.job(jid)), 120 * SLOW, 0.2) \
        or c.job(jid)
    check(f"{tag}: the job succeeds", j.get("state") == "succeeded",
          {**{k: j.get(k) for k in ("state", "error")}, "crashed workers": c.crashed()})
    if j.get("state") not in ("succeeded", "failed", "cancelled"):
        d.http(c.base, f"/v1/jobs/{jid}", "DELETE")  # not to take the next part's workers
    ref = ref or d.train_reference(BUILD, sp, TMP, tag.split(":")[0])
    diff = d.bit_diff(c.checkpoint(jid), ref)
    check(f"{tag}: its checkpoint equals `pipewright train`'s bit for bit", not diff, diff)
    ats = d.attempts(c, jid)
    states = [a.get("state") for a in ats]
    by_coord = [a for a in ats[:-1] if coord_restart and a.get("state") == "interrupted" and
                "coordinator" in (a.get("reason") or "")]
    # a chosen snapshot a survivor had already dropped (it ran one step further
    # than the coordinator had heard): that attempt ends "restore: ...", the
    # next resumes from the checkpoint, no restart spent
    refused = [a for a in ats[:-1] if ": restore: " in (a.get("reason") or "")]
    lost = [a for a in ats[:-1] if a.get("state") == "interrupted" and a not in by_coord and a not in refused]
    lo, hi = n_losses
    check(f"{tag}: {lo}{'' if lo == hi else '..' + str(hi)} attempt(s) interrupted by a loss"
          f"{' (and any ended by the coordinator restart)' if coord_restart else ''}, then one succeeded, in the API",
          states and states[-1] == "succeeded" and lo <= len(lost) <= hi and len(lost) + len(by_coord) + len(refused) == len(ats) - 1
          and [a.get("attempt") for a in ats] == list(range(1, len(ats) + 1)), ats)
    if refused:
        print(f"     note: attempt(s) {[a['attempt'] for a in refused]} found a chosen snapshot gone: "
              f"{[a.get('reason') for a in refused]}", flush=True)
    if by_coord:
        print(f"     note: attempt(s) {[a['attempt'] for a in by_coord]} ended by the coordinator's restart: "
              f"{[(a['state'], a.get('reason')) for a in by_coord]}", flush=True)
    if "restarts" in j:
        check(f"{tag}: restarts = {len(lost)} (one per attempt a loss ended)", j["restarts"] == len(lost),
              j["restarts"])
    rows = d.all_metrics(c, jid)
    by = {}
    for m in rows:
        by.setdefault(m["step"], set()).add(m["loss"])
    bad = {s: v for s, v in by.items() if len(v) > 1}
    runs = {m.get("run") for m in rows}
    check(f"{tag}: a step recorded by two attempts has the same loss ({len(runs)} runs recorded steps)",
          not bad and sorted(by) == list(range(sp["train"]["steps"])), (bad, sorted(by)[:5], len(by)))
    st_, m = d.http(c.base, f"/v1/jobs/{jid}/metrics?since=0")
    steps = [r["step"] for r in m.get("metrics", [])] if st_ == 200 else m
    check(f"{tag}: the job's metrics have one row per step", steps == list(range(sp["train"]["steps"])), steps)
    return ats


def check_lost(tag, c, jid, victims, observed, addrs):
    """worker_lost events name each victim (name, address before the loss,
    rank) at a step at least the one seen before the loss."""
    lost = lost_events(c, jid)
    for name, rank in victims:
        e = [x for x in lost if x.get("name") == name]
        check(f"{tag}: a worker_lost event names {name} ({addrs.get(name)}, rank {rank}) at step >= {observed}",
              len(e) == 1 and e[0]["rank"] == rank and e[0]["addr"] == addrs.get(name) and e[0]["step"] >= observed,
              lost)
    return lost


def check_resume(tag, c, jid, attempt, lost_step, allowed, ce=None, newest_ckpt=0):
    """The resume event of `attempt`: its source in `allowed`; a snapshot
    at most 1 step back, a checkpoint at most checkpoint_every back and at
    least as new as newest_ckpt (listed before the loss)."""
    rs = [r for r in resume_events(c, jid) if r.get("attempt") == attempt]
    if not check(f"{tag}: one resume event for attempt {attempt}", len(rs) == 1, resume_events(c, jid)):
        return None
    r = rs[0]
    check(f"{tag}: attempt {attempt} resumes from {' or '.join(allowed)}", r["from"] in allowed, r)
    if r["from"] == "snapshot":
        check(f"{tag}: ... at step {r['step']}: at most 1 before the loss at {lost_step}",
              lost_step - 1 <= r["step"] <= lost_step, r)
    elif r["from"] == "checkpoint":
        check(f"{tag}: ... at step {r['step']} (the checkpoint's), at most {ce} before the loss at {lost_step}"
              f" and not older than step {newest_ckpt} listed before it",
              r["ckpt"] == r["step"] and r["step"] % ce == 0 and lost_step - ce <= r["step"] <= lost_step and
              r["step"] >= newest_ckpt, r)
    else:
        check(f"{tag}: ... from step 0 only when no checkpoint was listed before the loss", newest_ckpt == 0,
              (r, newest_ckpt))
    ats = d.attempts(c, jid)
    a = [x for x in ats if x.get("attempt") == attempt]
    if a:
        check(f"{tag}: the API's attempt {attempt} says start_step {r['step']}, resumed_from {r['from']}",
              a[0].get("start_step") == r["step"] and a[0].get("resumed_from") == r["from"], a[0])
    return r


# ---------------------------------------------------------------------------
# the parts


def kill_one(c, snapshot_every, checkpoint_every, kill_at, tag, expect):
    sp = spec(tag, snapshot_every=snapshot_every, checkpoint_every=checkpoint_every)
    jid = c.submit(sp)
    step, ranks = running_at(c, jid, kill_at)
    if not check(f"{tag}: the job runs", step is not None, ranks):
        return
    rank = RND.randrange(4)
    victim = ranks[rank]
    old_run, ad = c.job(jid).get("run"), addrs(c)
    newest = max(checkpoint_steps(c, jid) or [0])
    t0 = time.time()
    c.signal_worker(victim, signal.SIGKILL)
    print(f"     killed {victim} (rank {rank}) at step >= {step}", flush=True)
    t_first = first_row_after(c, jid, {old_run}, t0, 60 * SLOW)
    lost = check_lost(tag, c, jid, [(victim, rank)], step, ad)
    ats = common_checks(tag, c, jid, sp)
    if lost and "step" in lost[0]:
        check_resume(tag, c, jid, 2, lost[0]["step"], expect, checkpoint_every, newest)
        TIMES.append((tag, lost[0]["time"] - t0, (t_first - t0) if t_first else None))
    if len(ats) == 2:
        check(f"{tag}: the first attempt ran on {victim}, the second without it",
              victim in ats[0]["workers"] and victim not in ats[1]["workers"] and len(ats[1]["workers"]) == 4, ats)


def part1(c):
    # killed before the first checkpoint (step CE): snapshots or nothing
    kill_one(c, 1, CE, 8, "1 kill, snapshots", ("snapshot",))


def part2(c):
    kill_one(c, 0, 3, 7, "2 kill, no snapshots", ("checkpoint",))


def part3(c):
    tag = "3 stop"
    sp = spec("1 kill, snapshots")  # the same training as part 1: the same reference
    jid = c.submit(sp)
    step, ranks = running_at(c, jid, 4)
    if not check(f"{tag}: the job runs", step is not None, ranks):
        return
    rank = 3  # the last rank reports the loss: its late step reports would matter
    victim = ranks[rank]
    old_run, ad = c.job(jid).get("run"), addrs(c)
    t0 = time.time()
    c.signal_worker(victim, signal.SIGSTOP)
    print(f"     stopped {victim} (rank {rank}) at step >= {step}", flush=True)
    lost = d.wait_for(lambda: lost_events(c, jid), HB + 10 * SLOW, 0.02)
    t_lost = lost[0]["time"] if lost else None
    check(f"{tag}: lost within heartbeat-timeout + 3 s", lost and t_lost - t0 <= HB + 3 * SLOW,
          (lost, t_lost and t_lost - t0))
    t_first = first_row_after(c, jid, {old_run}, t0, 60 * SLOW)
    # continued while its job runs on without it
    c.signal_worker(victim, signal.SIGCONT)
    still = c.job(jid).get("state")
    back = d.wait_for(lambda: victim in c.idle(), 20 * SLOW, 0.05)
    check(f"{tag}: continued, {victim} comes back idle (the job was {still})", back,
          [w for w in c.worker_rows() if w["name"] == victim])
    check_lost(tag, c, jid, [(victim, rank)], step, ad)
    common_checks(tag, c, jid, sp, ref=d.train_reference(BUILD, sp, TMP, "1 kill, snapshots"))
    if lost and "step" in lost[0]:
        check_resume(tag, c, jid, 2, lost[0]["step"], ("snapshot",), CE)
        late = [m for m in d.all_metrics(c, jid) if m.get("run") == old_run and m.get("time", 0) > t_lost + 0.5]
        check(f"{tag}: no row of the old run recorded after its loss", not late, late[:3])
        TIMES.append((tag, t_lost - t0, (t_first - t0) if t_first else None))
    w = [x for x in c.worker_rows() if x["name"] == victim]
    check(f"{tag}: {victim} is idle after the job", w and w[0]["state"] == "idle", w)


def part4(c):
    tag = "4 kill rank+holder"
    sp = spec("1 kill, snapshots")
    jid = c.submit(sp)
    step, ranks = running_at(c, jid, CE + 2)  # the checkpoint of step CE is stored
    if not check(f"{tag}: the job runs", step is not None, ranks):
        return
    r = RND.randrange(4)
    victims = [(ranks[r], r), (ranks[(r + 1) % 4], (r + 1) % 4)]
    old_run, ad = c.job(jid).get("run"), addrs(c)
    newest = max(checkpoint_steps(c, jid) or [0])
    t0 = time.time()
    for name, _ in victims:
        c.signal_worker(name, signal.SIGKILL, wait=False)
    for name, _ in victims:
        c.workers[name].wait()
    print(f"     killed {victims} at step >= {step} (newest checkpoint listed: {newest})", flush=True)
    # three left: the job waits for a fourth; start both again once the
    # coordinator has seen both go (a name still registered is refused)
    d.wait_for(lambda: lost_events(c, jid), HB + 10 * SLOW, 0.02)
    gone = d.wait_for(lambda: all(w["state"] == "lost" for w in c.worker_rows() if w["name"] in dict(victims)),
                      HB + 10 * SLOW, 0.02)
    check(f"{tag}: both are shown lost", gone, c.worker_rows())
    for name, _ in victims:
        c.start_worker(name)
    t_first = first_row_after(c, jid, {old_run}, t0, 60 * SLOW)
    # the run ends at the first loss: the second may be seen while the next
    # attempt is planned (no run to lose), so one event at least
    lost = lost_events(c, jid)
    named = [e for e in lost if (e.get("name"), e.get("rank")) in victims and e.get("addr") == ad.get(e.get("name"))
             and e.get("step", -1) >= step]
    check(f"{tag}: a worker_lost event names one of them (address, rank) at step >= {step}", named, lost)
    print(f"     worker_lost events: {[(e.get('name'), e.get('rank'), e.get('step')) for e in lost]}", flush=True)
    # killed 2 ms apart: an attempt may be dispatched to the second before
    # its link is seen closed (it ends at once; the next resumes alike)
    ats = common_checks(tag, c, jid, sp, n_losses=(1, 2), ref=d.train_reference(BUILD, sp, TMP, "1 kill, snapshots"))
    check(f"{tag}: every interrupted attempt names one of them",
          all(any(f"worker {n} " in (a.get("reason") or "") for n, _ in victims) for a in ats[:-1]), ats)
    steps = [x["step"] for x in lost if "step" in x]
    if steps and ats:
        check_resume(tag, c, jid, ats[-1]["attempt"], min(steps), ("checkpoint", "start"), CE, newest)
        TIMES.append((tag + " (restarts 2 workers)", min(x["time"] for x in lost) - t0,
                      (t_first - t0) if t_first else None))


def part5(c):
    tag = "5 coordinator kill"
    sp = spec("1 kill, snapshots")
    jid = c.submit(sp)
    step, ranks = running_at(c, jid, CE + 2)
    if not check(f"{tag}: the job runs", step is not None, ranks):
        return
    rank = RND.randrange(4)
    victim = ranks[rank]
    newest = max(checkpoint_steps(c, jid) or [0])
    old_run = c.job(jid).get("run")
    t0 = time.time()
    c.signal_worker(victim, signal.SIGKILL)
    seen = d.wait_for(lambda: lost_events(c, jid), 10 * SLOW, 0.005)
    c.kill_coordinator()  # in the middle of the recovery
    print(f"     killed {victim} (rank {rank}) at step >= {step}, the coordinator {time.time() - t0:.2f} s later "
          f"(worker_lost seen: {bool(seen)})", flush=True)
    c.start_coordinator()
    check(f"{tag}: the coordinator starts again on its state dir", c.coord.poll() is None)
    t_first = first_row_after(c, jid, {old_run}, t0, 60 * SLOW)
    TIMES.append((tag + " (and started again)", (seen[0]["time"] - t0) if seen else float("nan"),
                  (t_first - t0) if t_first else None))
    common_checks(tag, c, jid, sp, coord_restart=True,
                  ref=d.train_reference(BUILD, sp, TMP, "1 kill, snapshots"))
    rs = resume_events(c, jid)
    check(f"{tag}: a resume event, not from step 0 (checkpoint {newest} was listed)",
          rs and all("bad" not in r for r in rs) and (rs[-1]["step"] >= newest or rs[-1]["from"] == "snapshot"), rs)
    ats = d.attempts(c, jid)
    check(f"{tag}: the attempt that lost {victim} is interrupted", ats and victim in ats[0]["workers"] and
          ats[0]["state"] == "interrupted", ats)


def part6(c):
    tag = "6 duplicate name"
    name = "w2"
    before = [w for w in c.worker_rows() if w["name"] == name]
    dup_log = os.path.join(TMP, f"{c.tag}-dup-{name}.log")
    p = d._track(subprocess.Popen([os.path.join(BUILD, "pipewright-worker"), "--coordinator", f"127.0.0.1:{c.ctl}",
                                   "--listen", "127.0.0.1:0", "--name", name, "--state-dir",
                                   os.path.join(TMP, "dup-w2")], stdout=open(dup_log, "w"),
                                  stderr=subprocess.STDOUT))
    try:
        refused = d.wait_for(lambda: re.search(r"refused[^\n]*('" + name + r"'|\bname\b)",
                                               open(dup_log, errors="replace").read()), 10 * SLOW, 0.1)
        log = open(dup_log, errors="replace").read()
        check(f"{tag}: the second {name} is refused, its log says why", refused, log[-600:])
        time.sleep(HB + 0.5)  # past a heartbeat timeout: the first is not displaced
        after = [w for w in c.worker_rows() if w["name"] == name]
        check(f"{tag}: the first {name} keeps its registration (address, id, idle)",
              before and after and after[0]["addr"] == before[0]["addr"] and after[0]["id"] == before[0]["id"] and
              after[0]["state"] == "idle" and c.workers[name].poll() is None, (before, after))
        check(f"{tag}: the coordinator's log names the refusal",
              re.search(r"refus\w*[^\n]*'" + name + "'", c.log_text()), c.log_text()[-600:])
    finally:
        p.kill()
        p.wait()


def part7(c):
    tag = "7 no restarts"
    sp = spec("7", max_restarts=0)
    jid = c.submit(sp)
    step, ranks = running_at(c, jid, 3)
    if check(f"{tag}: the job runs", step is not None, ranks):
        rank = RND.randrange(4)
        victim = ranks[rank]
        c.signal_worker(victim, signal.SIGKILL)
        j = c.wait_job(jid, timeout=60 * SLOW)
        check(f"{tag}: losing {victim} fails the job, the error names it",
              j.get("state") == "failed" and f"worker {victim}" in (j.get("error") or ""), j.get("error"))
        ats = d.attempts(c, jid)
        check(f"{tag}: one attempt, failed; no attempt 2", len(ats) == 1 and ats[0].get("state") == "failed" and
              not [r for r in resume_events(c, jid) if r.get("attempt") != 1], (ats, resume_events(c, jid)))
    ensure_workers(c, tag)
    tag = "7 restarts exhausted"
    sp = spec("7b", max_restarts=1)
    jid = c.submit(sp)
    step, ranks = running_at(c, jid, 3)
    if not check(f"{tag}: the job runs", step is not None, ranks):
        return
    v1 = ranks[RND.randrange(4)]
    c.signal_worker(v1, signal.SIGKILL)
    got = d.wait_for(lambda: (lambda j: j.get("state") in ("succeeded", "failed", "cancelled") or
                              (j.get("state") == "running" and j.get("progress", {}).get("step", 0) > step + 1 and
                               any(r.get("attempt") == 2 for r in resume_events(c, jid))))(c.job(jid)),
                     60 * SLOW, 0.02)
    got = got and c.job(jid).get("state") == "running"
    ranks2 = c.ranks(jid)
    if check(f"{tag}: the second attempt runs", got and v1 not in ranks2, (c.job(jid).get("state"), ranks2)):
        v2 = ranks2[RND.randrange(4)]
        c.signal_worker(v2, signal.SIGKILL)
        j = c.wait_job(jid, timeout=60 * SLOW)
        err = j.get("error") or ""
        check(f"{tag}: the second loss fails the job; the error names {v1} and {v2}",
              j.get("state") == "failed" and f"worker {v1}" in err and f"worker {v2}" in err, err)
        ats = d.attempts(c, jid)
        check(f"{tag}: two attempts, interrupted then failed",
              [a.get("state") for a in ats] == ["interrupted", "failed"], ats)


def main():
    global TMP
    print(f"seed {SEED} (PW_TEST_SEED), {STEPS} steps a job, sanitizers {'on' if SANITIZE else 'off'}", flush=True)
    TMP = tempfile.mkdtemp(prefix="pw-recovery-")
    t_all = time.time()
    c = d.Cluster(BUILD, TMP, "rec", args=["--heartbeat-timeout", str(HB)], data_root=SRC)
    try:
        # the references first, both at once (the cluster idles meanwhile)
        th = [threading.Thread(target=d.train_reference, args=(BUILD, spec(t, **kw), TMP, t))
              for t, kw in (("1 kill, snapshots", {}), ("2 kill, no snapshots",
                                                        {"snapshot_every": 0, "checkpoint_every": 3}))]
        for t in th:
            t.start()
        for t in th:
            t.join()
        for part in (part1, part2, part3, part4, part5, part6, part7):
            if not check(f"{part.__name__}: five idle workers", ensure_workers(c, f"before {part.__name__}"),
                         c.worker_rows()):
                break
            t = time.time()
            part(c)
            print(f"     ({part.__name__}: {time.time() - t:.1f} s)", flush=True)
        ensure_workers(c, "after part7")
    finally:
        d.close_cluster(c, TMP, check, lambda: FAILED)
    for tag, det, rec in TIMES:
        print(f"recovery time: {tag}: lost after {det:.2f} s, next step recorded {rec:.2f} s after the loss"
              if rec is not None else f"recovery time: {tag}: lost after {det:.2f} s, no step recorded after it")
    print(f"{PASSED} passed, {FAILED} failed ({time.time() - t_all:.0f} s, seed {SEED})")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())

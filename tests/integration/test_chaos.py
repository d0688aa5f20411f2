#!/usr/bin/env python3
"""test_chaos: three jobs at once on seven workers while workers die — a
real coordinator (--heartbeat-timeout 2) and real workers on loopback.

Three pp=2 jobs (different seeds and schedules, max_restarts 20) take six
workers, one is spare. Every 2-4 s a loop kill -9s a random busy worker
(of a job that is running and has steps to go), and starts it again under
the same name a second later: never two down at once, at most N_KILLS
kills, within a time limit. Then:
  - every job succeeds and its checkpoint equals its own uninterrupted
    `pipewright train` run bit for bit (every tensor's dtype, shape, bytes);
  - the store (the API's attempts, else the runs table) shows every
    attempt: consecutive, interrupted ones then one succeeded; each kill
    interrupted the attempt it hit (the victim among its workers);
  - a step recorded by two attempts has the same loss;
  - afterwards all seven workers are idle.
Prints the seed (PW_TEST_SEED repeats the choices) and each kill's
recovery time (kill -> the job's next attempt's first step recorded).

Then a storm on one job (a coordinator of its own, its state dir on a
small tmpfs): heavy plans from twelve clients at once (the users' lane of
the HTTP pool full: they get 429s), the state disk full for a few seconds
while checkpoints are being uploaded, a worker kill -9, and a coordinator
kill -9 restarted on the same state dir. Checked: the job succeeds with
its final checkpoint stored, and its model equals its uninterrupted
`pipewright train` run bit for bit; the plans were turned away while no
checkpoint upload was; nothing said succeeded while a checkpoint was
missing. (Without mount permission the disk part is left out, said.)
Under PW_SANITIZE=ON the jobs are shorter and there are fewer kills.
Usage: test_chaos.py BUILD_DIR SOURCE_DIR"""
import os, random, re, signal, subprocess, sys, tempfile, threading, time

BUILD, SRC = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import driver as d  # noqa: E402  (Cluster, http, wait_for, bit_diff, train_reference)

SANITIZE = os.environ.get("PW_SANITIZE", "OFF") == "ON"
SLOW = 3 if SANITIZE else 1
STEPS = 1200 if SANITIZE else 3200
STORM_STEPS = 120 if SANITIZE else 400
N_KILLS = 4 if SANITIZE else 6
TIME_LIMIT = 40 * SLOW  # the kill loop's
HB = 2
NAMES = [f"c{i}" for i in range(7)]
SEED = int(os.environ.get("PW_TEST_SEED") or time.time() * 1000 % 1000000)
RND = random.Random(SEED)
PASSED = FAILED = 0
LOST_RE = re.compile(r"^worker \S+ \(\S+, rank \d+\) lost at step (\d+): ")
RESUME_RE = re.compile(r"^attempt (\d+) (?:resumes at step (\d+) from (snapshots in worker memory|the checkpoint of step "
                       r"\d+)|starts at step 0)$")


def check(label, ok, detail=""):
    global PASSED, FAILED
    print(f"{'ok  ' if ok else 'FAIL'} {label}{(': ' + str(detail)[:900]) if detail and not ok else ''}", flush=True)
    PASSED += bool(ok)
    FAILED += not ok
    return ok


def spec(i):
    return {"name": f"chaos-{i}",
            "model": {"template": "gpt", "vocab_size": 256, "seq_len": 32, "d_model": 32, "n_layers": 2,
                      "n_heads": 2},
            "mesh": {"pp": 2}, "schedule": {"name": ("1f1b", "gpipe", "zb-h1")[i], "microbatches": 4},
            "train": {"steps": STEPS, "batch_size": 8, "seed": 11 + i, "checkpoint_every": 50, "keep_checkpoints": 2,
                      "snapshot_every": 1, "max_restarts": 20,
                      "optimizer": {"name": "adamw", "lr": 3e-3, "warmup_steps": 5}},
            "data": {"kind": "text", "path": os.path.join(SRC, "examples/data/corpus.txt"), "sampler": "random"}}


def chaos(c, jobs):
    """The kill loop: [{worker, job, run, step, time}] of its kills."""
    kills, last = [], {}
    t_end = time.time() + TIME_LIMIT
    next_kill = time.time() + RND.uniform(2, 4)
    while len(kills) < N_KILLS and time.time() < t_end:
        time.sleep(max(0.0, next_kill - time.time()))
        js = {j: c.job(j) for j in jobs}
        if all(x.get("state") in ("succeeded", "failed", "cancelled") for x in js.values()):
            break
        # a running job that is stepping (progress since the last look) and has steps to go
        live = {j for j, x in js.items() if x.get("state") == "running" and
                (x.get("progress") or {}).get("step", 0) > last.get(j, -1) and
                (x.get("progress") or {}).get("step", 0) < STEPS - 20}
        for j, x in js.items():
            last[j] = (x.get("progress") or {}).get("step", 0)
        busy = sorted((w["name"], w["job"]) for w in c.worker_rows()
                      if w.get("state") == "busy" and w.get("job") in live and w["name"] in NAMES)
        if not busy:
            next_kill = time.time() + 0.3
            continue
        victim, jid = RND.choice(busy)
        k = {"worker": victim, "job": jid, "run": js[jid].get("run"), "step": last[jid], "time": time.time()}
        c.signal_worker(victim, signal.SIGKILL)
        kills.append(k)
        print(f"     kill {len(kills)}: {victim} of job {jid} (run {k['run']}) at step {k['step']}", flush=True)
        time.sleep(1.0)
        c.start_worker(victim)
        next_kill = k["time"] + RND.uniform(2, 4)
    return kills


def storm_spec():
    return {"name": "storm",
            "model": {"template": "gpt", "vocab_size": 256, "seq_len": 32, "d_model": 32, "n_layers": 2,
                      "n_heads": 2},
            "mesh": {"pp": 2}, "schedule": {"name": "1f1b", "microbatches": 4},
            "train": {"steps": STORM_STEPS, "batch_size": 8, "seed": 21, "checkpoint_every": 10,
                      "keep_checkpoints": 2, "snapshot_every": 1, "max_restarts": 20,
                      "optimizer": {"name": "adamw", "lr": 3e-3, "warmup_steps": 5}},
            "data": {"kind": "text", "path": os.path.join(SRC, "examples/data/corpus.txt"), "sampler": "random"}}


# A plan of ~1 s of CPU, well inside the budget (512 blocks x 64 ranks x 1 tp): twelve clients keep the
# users' lane (2 threads, 8 queued) full.
HEAVY = {"name": "heavy", "model": {"template": "gpt", "vocab_size": 256, "seq_len": 16, "d_model": 16,
                                    "n_layers": 128, "n_heads": 2},
         "mesh": {"pp": 64}, "schedule": {"name": "1f1b", "microbatches": 64},
         "train": {"steps": 1, "batch_size": 64}, "data": {"kind": "copy"}}


def storm(tmp):
    """The storm phase (see the module's docstring)."""
    state = os.path.join(tmp, "storm-coord")
    os.makedirs(state)
    disk = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", state], capture_output=True).returncode == 0
    if not disk:
        print("     note: mount -t tmpfs is not permitted here: the storm goes without a full disk", flush=True)
    sp = storm_spec()
    ref = {}
    ref_thread = threading.Thread(target=lambda: ref.update(m=d.train_reference(BUILD, sp, tmp, "storm", nice=15)),
                                  daemon=True)
    ref_thread.start()
    c = d.Cluster(BUILD, tmp, "storm", args=["--heartbeat-timeout", str(HB)], data_root=SRC)
    stop, said = threading.Event(), {"busy": 0, "ok": 0, "other": []}
    seen_succeeded_without = []

    def plans():
        while not stop.is_set():
            st_, r = d.http(c.base, "/v1/plans", "POST", HEAVY, timeout=120)
            if st_ == 429:
                said["busy"] += 1
                time.sleep(0.2)
            elif st_ == 200:
                said["ok"] += 1
            elif st_ != 0:  # 0: the coordinator was being killed
                said["other"].append((st_, str(r)[:200]))

    def watch(jid):  # nothing says succeeded while the final checkpoint is missing
        while not stop.is_set():
            j = c.job(jid)
            if j.get("state") == "succeeded":
                st_, ck = d.http(c.base, f"/v1/jobs/{jid}/checkpoints")
                steps = [x["step"] for x in (ck.get("checkpoints", ck) if isinstance(ck, dict) else ck or [])]
                if STORM_STEPS not in steps:
                    seen_succeeded_without.append(steps)
                return
            time.sleep(0.05)

    filler = os.path.join(state, "filler")
    threads = []
    try:
        for n in ("s0", "s1", "s2"):
            c.start_worker(n)
        check("storm: three idle workers", c.wait_idle(3, 30 * SLOW), c.worker_rows())
        jid = c.submit(sp)
        threads = [threading.Thread(target=plans, daemon=True) for _ in range(12)]
        threads.append(threading.Thread(target=watch, args=(jid,), daemon=True))
        for t in threads:
            t.start()
        at = lambda k: d.wait_for(lambda: c.step(jid) >= k or c.job(jid).get("state") in  # noqa: E731
                                  ("succeeded", "failed", "cancelled"), 120 * SLOW, 0.05)
        check("storm: the job steps under the plans", at(STORM_STEPS // 5), c.job(jid))
        if disk:  # the state disk full while checkpoints come in
            d.fill_disk(filler)
            time.sleep(3)
            os.unlink(filler)
            print(f"     disk full for 3 s at step {c.step(jid)}", flush=True)
        at(2 * STORM_STEPS // 5)
        busy = sorted(w["name"] for w in c.worker_rows() if w.get("state") == "busy" and w.get("job") == jid)
        if busy:
            victim = RND.choice(busy)
            print(f"     kill -9 worker {victim} at step {c.step(jid)}", flush=True)
            c.signal_worker(victim, signal.SIGKILL)
            time.sleep(1.0)
            c.start_worker(victim)
        at(3 * STORM_STEPS // 5)
        print(f"     kill -9 the coordinator at step {c.step(jid)}", flush=True)
        c.kill_coordinator()
        time.sleep(1.0)
        c.start_coordinator()
        j = c.wait_job(jid, timeout=300 * SLOW)
        stop.set()
        for t in threads:
            t.join(150)
        ref_thread.join(600 * SLOW)
        check("storm: the job succeeds", j.get("state") == "succeeded", {k: j.get(k) for k in ("state", "error")})
        st_, ck = d.http(c.base, f"/v1/jobs/{jid}/checkpoints")
        steps = [x["step"] for x in (ck.get("checkpoints", ck) if isinstance(ck, dict) else ck or [])]
        check(f"storm: its final checkpoint (step {STORM_STEPS}) is stored", STORM_STEPS in steps, steps)
        diff = d.bit_diff(c.checkpoint(jid), ref.get("m"))
        check("storm: its model equals its `pipewright train` run bit for bit", not diff, diff)
        check(f"storm: the heavy plans were turned away ({said['busy']} x 429, {said['ok']} planned), nothing else",
              said["busy"] > 0 and not said["other"], said)
        st_, m = d.http(c.base, "/metrics")
        up = [ln for ln in str(m).splitlines() if ln.startswith("pipewright_http_upload_busy_total ")]
        check("storm: no checkpoint upload was turned away since the restart", up == ["pipewright_http_upload_busy_total 0"],
              up)
        check("storm: nothing said succeeded while its final checkpoint was missing", not seen_succeeded_without,
              seen_succeeded_without)
        log = open(c.log, errors="replace").read()
        check("storm: no upload was answered 429 before the restart either",
              not re.search(r"PUT /v1/jobs/\d+/runs/.* answered 429", log), log[-600:])
    finally:
        stop.set()
        d.close_cluster(c, tmp, check, lambda: FAILED)
        if disk:
            subprocess.run(["umount", "-l", state])


def main():
    print(f"seed {SEED} (PW_TEST_SEED), {STEPS} steps a job, at most {N_KILLS} kills in {TIME_LIMIT} s, "
          f"sanitizers {'on' if SANITIZE else 'off'}", flush=True)
    tmp = tempfile.mkdtemp(prefix="pw-chaos-")
    t_all = time.time()
    c = d.Cluster(BUILD, tmp, "chaos", args=["--heartbeat-timeout", str(HB)], data_root=SRC)
    rc = None
    try:
        for n in NAMES:
            c.start_worker(n)
        if not check("seven idle workers", c.wait_idle(7, 30 * SLOW), c.worker_rows()):
            return 1
        specs = [spec(i) for i in range(3)]
        # the references meanwhile, niced, one after the other: they take
        # the CPU the cluster leaves (and slow it: more steps to kill in)
        refs = {}

        def ref_all():
            for i in range(3):
                refs[i] = d.train_reference(BUILD, specs[i], tmp, f"chaos-{i}", nice=15)
        ref_thread = threading.Thread(target=ref_all, daemon=True)
        ref_thread.start()
        jobs = [c.submit(s) for s in specs]
        running = d.wait_for(lambda: all(c.job(j).get("state") == "running" for j in jobs), 30 * SLOW, 0.05)
        check("the three jobs run at once", running, [c.job(j).get("state") for j in jobs])
        kills = chaos(c, jobs)
        check(f"the loop killed workers ({len(kills)})", len(kills) >= 2, kills)
        t_chaos = time.time() - t_all
        ends = [c.wait_job(j, timeout=120 * SLOW) for j in jobs]
        ref_thread.join(600 * SLOW)  # niced: on a loaded host they get what is left
        times = []
        for i, (jid, j) in enumerate(zip(jobs, ends)):
            tag = f"job {jid} ({specs[i]['schedule']['name']}, seed {specs[i]['train']['seed']})"
            mine = [k for k in kills if k["job"] == jid]
            check(f"{tag}: succeeds after {len(mine)} kills", j.get("state") == "succeeded",
                  {k: j.get(k) for k in ("state", "error")})
            diff = d.bit_diff(c.checkpoint(jid), refs.get(i))
            check(f"{tag}: its checkpoint equals its `pipewright train` run bit for bit", not diff, diff)
            ats = d.attempts(c, jid)
            states = [a.get("state") for a in ats]
            check(f"{tag}: {len(ats)} attempts in the API, consecutive, interrupted then succeeded",
                  states and states[-1] == "succeeded" and all(s == "interrupted" for s in states[:-1]) and
                  [a.get("attempt") for a in ats] == list(range(1, len(ats) + 1)), ats)
            for k in mine:
                hit = [a for a in ats if a.get("run") == k["run"]]
                check(f"{tag}: the kill of {k['worker']} interrupted its attempt (run {k['run']})",
                      hit and hit[0]["state"] == "interrupted" and k["worker"] in hit[0]["workers"], (k, ats))
            # A survivor may have taken a newer snapshot (dropping the one chosen)
            # before the coordinator heard of it: that attempt ends "restore: ...",
            # the next resumes from the checkpoint and no restart is spent on it.
            refused = [a for a in ats if ": restore: " in (a.get("reason") or "")]
            if refused:
                print(f"     note: {len(refused)} attempt(s) found a chosen snapshot gone and went on from the "
                      f"checkpoint: {[a.get('reason') for a in refused]}", flush=True)
            check(f"{tag}: one attempt more than the runs killed ({len({k['run'] for k in mine})}), "
                  f"and one per snapshot gone ({len(refused)})",
                  len(ats) == 1 + len({k["run"] for k in mine}) + len(refused), (mine, ats))
            if "restarts" in j:
                check(f"{tag}: restarts = {len(ats) - 1 - len(refused)}", j["restarts"] == len(ats) - 1 - len(refused),
                      j["restarts"])
            # each resume: from where the loss left it (snapshots: that step or
            # the one before; a checkpoint: at most 50 back), never past it
            seq, bad = [], []
            for e in c.events(jid):
                m = LOST_RE.match(e["message"]) if e.get("kind") == "worker_lost" else None
                if m:
                    seq.append(int(m.group(1)))
                r = RESUME_RE.match(e["message"]) if e.get("kind") == "resume" else None
                if r and int(r.group(1)) > 1 and seq:
                    step, lost = int(r.group(2) or 0), seq[-1]
                    lo = lost - 1 if (r.group(3) or "").startswith("snapshots") else lost - 50
                    if not lo <= step <= lost:
                        bad.append(f"lost at step {lost}, then: {e['message']}")
            check(f"{tag}: every attempt resumes at the step of the loss or before it, not after", not bad, bad)
            rows = d.all_metrics(c, jid)
            by = {}
            for m in rows:
                by.setdefault(m["step"], set()).add(m["loss"])
            bad = {s: v for s, v in by.items() if len(v) > 1}
            check(f"{tag}: a step recorded by two attempts has the same loss; every step recorded",
                  not bad and sorted(by) == list(range(STEPS)), (bad, len(by)))
            for k in mine:
                nxt = [m["time"] for m in rows if m.get("run") and k["run"] and m["run"] > k["run"]]
                times.append((k, min(nxt) - k["time"] if nxt else None))
        crashed = c.crashed()
        check("no worker exited unless killed", not crashed, crashed)
        check("afterwards all seven workers are idle", d.wait_for(lambda: len(c.idle()) == 7, 20 * SLOW),
              c.worker_rows())
        for k, t in times:
            print(f"recovery time: kill of {k['worker']} (job {k['job']}, run {k['run']}, step {k['step']}): "
                  + (f"next step recorded {t:.2f} s later" if t is not None else "no step recorded after it"))
        ok = [t for _, t in times if t is not None]
        if ok:
            print(f"recovery times: {len(ok)} kills, min {min(ok):.2f} s, median {sorted(ok)[len(ok) // 2]:.2f} s, "
                  f"max {max(ok):.2f} s (chaos phase {t_chaos:.0f} s)")
    finally:
        d.close_cluster(c, tmp, check, lambda: FAILED)
    storm(tempfile.mkdtemp(prefix="pw-storm-"))
    print(f"{PASSED} passed, {FAILED} failed ({time.time() - t_all:.0f} s, seed {SEED})")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())

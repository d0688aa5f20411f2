#!/usr/bin/env python3
"""test_drain: a preempted coordinator keeps the work (issue 35) — a real
coordinator with --drain-timeout and two real workers on loopback, a pp 2
GPT on the example corpus with one checkpoint, at its end.

  1. An idempotent submit: the same job with the same Idempotency-Key
     (`pipewright submit --key`) gives the first job back (200, "existing"),
     the CLI says so; the key with another job is refused (409, naming
     the header); a key with a space is refused (400).
  2. SIGTERM mid-run (the preemption signal): the coordinator tells the
     ranks to stop at a step none has begun, they write that step's
     checkpoint, it exits 0 within its drain timeout; the job is queued
     again, its attempt says it ended after step S with its checkpoint,
     S is past the steps recorded before the signal (nothing done is
     lost), and the checkpoint of step S is stored.
  3. A coordinator started again on the state directory resumes the job
     at step S from that checkpoint (no step repeated, none lost), the
     job succeeds and its final checkpoint equals `pipewright train`'s bit
     for bit; a submit with the first key still gives that job.
  4. Without --drain-timeout SIGTERM stops at once (the old behaviour):
     the job resumes from its last checkpoint.

Usage: test_drain.py BUILD_DIR SOURCE_DIR"""
import json, os, signal, subprocess, sys, tempfile, time

BUILD, SRC = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import driver as d  # noqa: E402

SANITIZE = os.environ.get("PW_SANITIZE", "OFF") == "ON"
STEPS = 300 if SANITIZE else 1000  # the drain stops half a second of steps ahead: the job must outlast that
check = d.Checks()


def spec(name, steps=STEPS):
    return d.tiny_gpt(name, steps, 3, SRC)


def submit_key(c, body, key):
    """(status, reply) of POST /v1/jobs with an Idempotency-Key."""
    import urllib.request, urllib.error
    req = urllib.request.Request(c.base + "/v1/jobs", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "Idempotency-Key": key})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def cli(c, *args):
    return subprocess.run([os.path.join(BUILD, "pipewright"), *args, "--coordinator", c.base],
                          capture_output=True, text=True, timeout=120)


def main():
    tmp = tempfile.mkdtemp(prefix="pw-drain-")
    ref = d.train_reference(BUILD, spec("ref"), tmp, "drain")
    c = d.Cluster(BUILD, tmp, "dr", args=["--drain-timeout", "60"], data_root=SRC)
    for n in ("a", "b"):
        c.start_worker(n)
    check("two workers idle", c.wait_idle(2))

    # 1. the idempotent submit
    jf = os.path.join(tmp, "job.json")
    json.dump(spec("drained"), open(jf, "w"))
    p1 = cli(c, "submit", "--job", jf, "--key", "slurm-42", "--quiet")
    p2 = cli(c, "submit", "--job", jf, "--key", "slurm-42")
    jid = int(p1.stdout.strip() or 0) if p1.returncode == 0 else 0
    check("pipewright submit --key queues the job", jid > 0, p1.stderr)
    check("the same job with the same key gives the first job back, and the CLI says so",
          p2.returncode == 0 and f"job {jid} " in p2.stdout and "submitted before with this key" in p2.stdout,
          p2.stdout + p2.stderr)
    st, r = submit_key(c, spec("drained"), "slurm-42")
    check("POST /v1/jobs with that Idempotency-Key: 200, the same id, existing", st == 200 and r.get("id") == jid
          and r.get("existing") is True, (st, r))
    st, r = submit_key(c, spec("other", 10), "slurm-42")
    check("the key with another job: 409 at Idempotency-Key", st == 409 and
          (r.get("error") or {}).get("path") == "Idempotency-Key", (st, r))
    st, r = submit_key(c, spec("other", 10), "a b")
    check("a key with a space: 400 at Idempotency-Key", st == 400 and
          (r.get("error") or {}).get("path") == "Idempotency-Key", (st, r))
    st, jobs = d.http(c.base, "/v1/jobs")
    check("one job in all", st == 200 and len(jobs.get("jobs", [])) == 1, jobs)

    # 2. SIGTERM mid-run: drain
    check("the job runs", d.wait_for(lambda: c.step(jid) >= 10, 120))
    before = c.step(jid)
    c.coord.send_signal(signal.SIGTERM)
    try:
        rc = c.coord.wait(timeout=60)
    except subprocess.TimeoutExpired:
        rc = None
    check("on SIGTERM the coordinator drains and exits 0", rc == 0, rc)
    log = c.log_text()
    check("its log says it drains", "draining 1 run" in log and "every run stopped at its checkpoint" in log,
          log[-1500:])
    c.start_coordinator()
    j = c.job(jid)
    atts = d.attempts(c, jid)
    reason = (atts[0].get("reason") or "") if atts else ""
    import re
    m = re.search(r"ended after step (\d+) with its checkpoint", reason)
    stop = int(m.group(1)) if m else 0
    check("attempt 1 ended after step S with its checkpoint", m is not None, atts)
    check(f"S ({stop}) is past the steps recorded before the signal ({before}) and before the end",
          before <= stop < STEPS, (before, stop))
    st, cks = d.http(c.base, f"/v1/jobs/{jid}/checkpoints")
    steps = [x.get("step") for x in (cks.get("checkpoints") or [])] if st == 200 and isinstance(cks, dict) else []
    check(f"the checkpoint of step {stop} is stored", stop in steps, cks)

    # 3. the same state dir again: it resumes at S
    j = c.wait_job(jid, 300)
    check("started again on the state dir, the job succeeds", j.get("state") == "succeeded", j)
    atts = d.attempts(c, jid)
    check(f"attempt 2 started at step {stop}", len(atts) >= 2 and atts[1].get("start_step") == stop, atts)
    diff = d.bit_diff(c.checkpoint(jid), ref)
    check("its final checkpoint equals pipewright train's bit for bit", diff == "", diff)
    st, r = submit_key(c, spec("drained"), "slurm-42")
    check("the first key still gives that job (succeeded)", st == 200 and r.get("id") == jid and
          r.get("state") == "succeeded", (st, r))
    d.stop_checked(c, check)

    # 4. without --drain-timeout: at once, from the last checkpoint
    c2 = d.Cluster(BUILD, tmp, "nd", data_root=SRC)
    for n in ("a", "b"):
        c2.start_worker(n)
    c2.wait_idle(2)
    s2 = spec("plain")
    s2["train"]["checkpoint_every"] = 20
    j2 = c2.submit(s2)
    d.wait_for(lambda: c2.step(j2) >= 25, 120)
    c2.coord.send_signal(signal.SIGTERM)
    check("without --drain-timeout SIGTERM stops at once, exit 0", c2.coord.wait(timeout=30) == 0)
    c2.start_coordinator()
    j = c2.wait_job(j2, 300)
    atts = d.attempts(c2, j2)
    check("the job resumes from a checkpoint_every step and succeeds", j.get("state") == "succeeded" and
          len(atts) >= 2 and atts[1].get("start_step", 1) % 20 == 0, atts)
    d.stop_checked(c2, check)

    return d.finish(tmp, check)


if __name__ == "__main__":
    try:
        sys.exit(main())
    finally:
        d._kill_all()

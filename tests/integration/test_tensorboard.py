#!/usr/bin/env python3
"""test_tensorboard: a job's curves as TensorBoard event files and its
metrics as CSV and JSON lines, against the metrics API, read with
TensorBoard's own readers (from .venv/, deploy/requirements-test.txt) and
with ours (`pipewright tfevents`). A real coordinator with
--tensorboard-dir and two workers on loopback:

  1. A finished pp 2 GPT (12 steps, eval every 4): GET .../events.tfevents
     loaded by EventAccumulator holds every scalar of every metrics row
     (train/loss, lr, grad_norm, tokens_per_s, step_time, eval/loss),
     equal to the row's value rounded to float32, at the row's step and
     wall time, no step missing or extra, no null made a value; and at
     each sampled step the timeline view's measured bubble and each rank's
     busy seconds and idle share (pipeline/...). The raw records are a
     file_version "brain.Event:2", a SessionLog START, then the rows, and
     `pipewright tfevents --json` reads the same events as TensorBoard's
     loader. The directory's file for the run is those very bytes. CSV and
     JSON lines equal the JSON rows (with all=1 too); format=xml is a 400
     naming json, csv and jsonl.
  2. A copy with one byte changed in a record's data, one in a record's
     length, and one cut inside a record: TensorBoard's record reader
     raises DataLossError ("failed event crc32 check", "failed header
     crc32 check", "truncated record in data") after the same whole
     records our reader gives, and ours names the same check and the
     record's offset (exit 1); TensorBoard's loader yields those records
     only and logs the error.
  3. kill -9 of the coordinator while a job runs (its workers stopped
     mid-run, so it cannot end first): every event file in the directory
     reads as whole records with both readers (anything else there is
     only a writer's temporary file); after a restart the job resumes from
     its checkpoint in a new run, whose file starts with a SessionLog
     START where that run starts: the directory and the API's file, read
     by EventAccumulator (which drops what the first run recorded from
     there on), equal the metrics API's rows step for step.
  4. A write that fails (the job's folder taken by a file) is counted in
     /metrics and logged naming the job, the run and why; the job is not
     held back.
Usage: test_tensorboard.py BUILD_DIR SOURCE_DIR (run by the venv's python)"""
import csv, io, json, logging, os, re, signal, struct, subprocess, sys, tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import driver as d  # noqa: E402

from tensorboard.backend.event_processing import event_accumulator as ea  # noqa: E402
from tensorboard.backend.event_processing import event_file_loader as efl  # noqa: E402
from tensorboard.compat.tensorflow_stub import errors as tf_errors  # noqa: E402
from tensorboard.compat.tensorflow_stub import pywrap_tensorflow as tf_pywrap  # noqa: E402

BUILD, SRC = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
check = d.Checks()
logging.getLogger("tensorboard").setLevel(logging.ERROR)  # its notes on purged steps: the checks say it
COLS = {"loss": "train/loss", "eval_loss": "eval/loss", "lr": "train/lr", "grad_norm": "train/grad_norm",
        "tokens_per_s": "train/tokens_per_s", "step_time": "train/step_time"}


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def spec(name, steps, d_model, seq, batch, mb, **train):
    return {"name": name,
            "model": {"template": "gpt", "vocab_size": 256, "seq_len": seq, "d_model": d_model, "n_layers": 4,
                      "n_heads": 2},
            "mesh": {"pp": 2}, "schedule": {"name": "1f1b", "microbatches": mb},
            "train": {"steps": steps, "batch_size": batch, "seed": 3,
                      "optimizer": {"name": "adamw", "lr": 3e-3, "warmup_steps": 3}, **train},
            "data": {"kind": "text", "path": os.path.join(SRC, "examples/data/corpus.txt"), "sampler": "sequential"}}


def scalars(path):
    """{tag: [(step, wall_time, value)]} as TensorBoard's EventAccumulator
    gives them (a file or a directory of them; every event kept)."""
    acc = ea.EventAccumulator(path, size_guidance={ea.SCALARS: 0})
    acc.Reload()
    return {t: [(e.step, e.wall_time, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}


def pipeline_figures(tl):
    """{tag: value} of a sampled step, from the timeline view: its measured
    bubble, and each rank's busy seconds and idle share of the step's span
    (pipeline actions F, B, I, W; sums in the order the coordinator adds)."""
    def pipe(a):
        k = a.get("kind")
        return (isinstance(k, str) and k[:1] in ("F", "B", "I", "W") and k != "") or \
            (isinstance(k, int) and not isinstance(k, bool) and 0 <= k < 4)
    t0 = t1 = None
    busy_all, per = 0.0, []
    for rk in tl["ranks"]:
        b = 0.0
        for a in rk["actions"]:
            if not pipe(a):
                continue
            s, e = a["start"], a["end"]
            t0 = s if t0 is None or s < t0 else t0
            t1 = e if t1 is None or e > t1 else t1
            if e - s > 0:
                b += e - s
                busy_all += e - s
        per.append((rk["rank"], b))
    if t0 is None or not per or t1 - t0 <= 0:
        return {}
    span = t1 - t0
    idle = len(per) * span - busy_all
    out = {"pipeline/bubble": f32(idle / (len(per) * span) if idle > 0 else 0.0)}
    for r, b in per:
        out[f"pipeline/rank{r}/busy_s"] = f32(b)
        out[f"pipeline/rank{r}/bubble"] = f32((span - b) / span if span - b > 0 else 0.0)
    return out


def expected(c, jid, rows):
    """{tag: [(step, wall_time, value)]}: what the rows (and the sampled
    steps' timelines) say TensorBoard must show."""
    want = {}
    st_, tl = d.http(c.base, f"/v1/jobs/{jid}/timeline")
    sampled = set(tl.get("steps") or []) if st_ == 200 else set()
    for r in rows:
        for col, tag in COLS.items():
            if r.get(col) is not None:
                want.setdefault(tag, []).append((r["step"], r["time"], f32(r[col])))
        if r["step"] in sampled:
            st_, tl = d.http(c.base, f"/v1/jobs/{jid}/timeline?step={r['step']}")
            for tag, v in (pipeline_figures(tl) if st_ == 200 else {"timeline": st_}).items():
                want.setdefault(tag, []).append((r["step"], r["time"], v))
    return want


def first_diff(got, want):
    """'' when equal, else the first tag / step that differs."""
    for tag in sorted(set(got) | set(want)):
        g, w = got.get(tag), want.get(tag)
        if g != w:
            if g is None or w is None:
                return f"{tag}: only {'TensorBoard' if w is None else 'the API'} has it"
            gs, ws = [x[0] for x in g], [x[0] for x in w]
            if gs != ws:
                k = next((i for i, (a, b) in enumerate(zip(gs, ws)) if a != b), min(len(gs), len(ws)))
                return f"{tag}: TensorBoard's steps {gs[max(0, k - 3):k + 5]} (of {len(gs)}), " \
                       f"the API's {ws[max(0, k - 3):k + 5]} (of {len(ws)})"
            a, b = next((a, b) for a, b in zip(g, w) if a != b)
            return f"{tag} step {a[0]}: TensorBoard (wall time, value) {a[1:]}, API {b[1:]}"
    return ""


def ours(path):
    """`pipewright tfevents --json PATH`: (exit code, [events], stderr)."""
    p = subprocess.run([os.path.join(BUILD, "pipewright"), "tfevents", "--json", path], capture_output=True, text=True)
    return p.returncode, [json.loads(x) for x in p.stdout.splitlines() if x.strip()], p.stderr


def tb_records(path):
    """TensorBoard's record reader over a file: (whole records read, the
    DataLossError's message or None)."""
    r = tf_pywrap.PyRecordReader_New(path.encode(), 0, b"", None)
    n = 0
    while True:
        try:
            r.GetNext()
        except tf_errors.OutOfRangeError:
            return n, None
        except tf_errors.DataLossError as e:
            return n, e.message
        n += 1


def same_events(path):
    """'' when TensorBoard's loader and `pipewright tfevents` read the same
    events from path (kind, wall time, step, tags and values)."""
    tb = list(efl.LegacyEventFileLoader(path).Load())
    rc, mine, err = ours(path)
    if rc != 0 or len(mine) != len(tb):
        return f"exit {rc}, {len(mine)} events, TensorBoard {len(tb)}: {err[-300:]}"
    for k, (e, m) in enumerate(zip(tb, mine)):
        kind = e.WhichOneof("what")
        got = {"wall_time": m["wall_time"], "step": m["step"], "version": m.get("version"), "start": m.get("start"),
               "scalars": m.get("scalars")}
        want = {"wall_time": e.wall_time, "step": e.step,
                "version": e.file_version if kind == "file_version" else None,
                "start": True if kind == "session_log" and e.session_log.status == 1 else None,
                "scalars": {v.tag: v.simple_value for v in e.summary.value} if kind == "summary" else None}
        if got != want:
            return f"event {k}: ours {got}, TensorBoard {want}"
    return ""


def file_checks(c, jid, tbdir, tmp):
    """Part 1: the finished job's file, its directory copy, CSV and JSON lines."""
    st_, m = d.http(c.base, f"/v1/jobs/{jid}/metrics")
    rows = m["metrics"] if st_ == 200 else []
    check("12 metrics rows, steps 0..11", [r["step"] for r in rows] == list(range(12)), rows[:2])
    check("eval_loss on steps 3, 7 and 11 only",
          [r["step"] for r in rows if r["eval_loss"] is not None] == [3, 7, 11], [r["eval_loss"] for r in rows])
    st_, blob = d.http(c.base, f"/v1/jobs/{jid}/events.tfevents", raw=True)
    check("GET events.tfevents answers 200 with bytes", st_ == 200 and isinstance(blob, bytes), (st_, str(blob)[:200]))
    path = os.path.join(tmp, "api", "events.out.tfevents.api")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    open(path, "wb").write(blob if isinstance(blob, bytes) else b"")
    want = expected(c, jid, rows)
    check("the sampled steps give pipeline figures (bubble, each rank's busy and idle)",
          len(want.get("pipeline/bubble", [])) >= 1 and "pipeline/rank1/bubble" in want, sorted(want))
    got = scalars(path)
    diff = first_diff(got, want)
    check("TensorBoard's EventAccumulator: every scalar equals the metrics row, float32, step for step", not diff, diff)
    check("... no null became a value: eval/loss at steps 3, 7, 11 only",
          [s for s, _, _ in got.get("eval/loss", [])] == [3, 7, 11], got.get("eval/loss"))
    raw = list(efl.LegacyEventFileLoader(path).Load())
    check("records: file_version brain.Event:2, a SessionLog START at step 0, then a summary per row",
          len(raw) == 2 + len(rows) and raw[0].file_version == "brain.Event:2" and
          raw[1].session_log.status == 1 and raw[1].step == 0 and
          all(e.WhichOneof("what") == "summary" for e in raw[2:]), [e.WhichOneof("what") for e in raw[:4]])
    diff = same_events(path)
    check("`pipewright tfevents` reads the same events as TensorBoard's loader", not diff, diff)
    # the directory's file: the run's, the same bytes
    job = c.job(jid)
    folder = os.path.join(tbdir, f"job-{jid}")
    names = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
    name = f"events.out.tfevents.{int(job.get('created') or 0)}.pipewright.{job.get('run', 0):010d}"
    check(f"--tensorboard-dir holds job-{jid}/{name} alone", names == [name], names)
    dir_blob = open(os.path.join(folder, name), "rb").read() if names == [name] else b""
    check("... byte for byte the API's file (one run)", dir_blob == blob, (len(dir_blob), len(blob or b"")))
    diff = first_diff(scalars(folder), want)
    check("... and TensorBoard reads the directory as the rows", not diff, diff)
    # CSV and JSON lines
    for q in ("", "&all=1"):
        st_, m = d.http(c.base, f"/v1/jobs/{jid}/metrics?since=0{q}")
        jrows = m.get("metrics", []) if st_ == 200 else []
        st_, text = d.http(c.base, f"/v1/jobs/{jid}/metrics?since=0{q}&format=csv", raw=True)
        table = list(csv.reader(io.StringIO(text.decode()))) if st_ == 200 else []
        keys = list(jrows[0].keys()) if jrows else []
        parsed = [{k: (None if cell == "" else json.loads(cell)) for k, cell in zip(table[0], line)}
                  for line in table[1:]] if table else []
        check(f"CSV{q}: a header of the JSON's keys in order, a line per row, the same values",
              table and table[0] == keys and parsed == jrows and all(len(x) == len(keys) for x in table),
              (table[:2], jrows[:1]))
        st_, text = d.http(c.base, f"/v1/jobs/{jid}/metrics?since=0{q}&format=jsonl", raw=True)
        lines = text.decode().split("\n") if st_ == 200 else []
        check(f"JSON lines{q}: one object per line, each the JSON's row",
              lines and lines[-1] == "" and [json.loads(x) for x in lines[:-1]] == jrows, lines[:2])
    st_, err = d.http(c.base, f"/v1/jobs/{jid}/metrics?format=xml")
    msg = (err.get("error") or {}) if isinstance(err, dict) else {}
    check("format=xml: 400 at format naming json, csv and jsonl",
          st_ == 400 and msg.get("path") == "format" and all(f in msg.get("message", "") for f in ("json", "csv", "jsonl")),
          (st_, err))
    st_, err = d.http(c.base, "/v1/jobs/987654/events.tfevents")
    check("an unknown job's events.tfevents: 404", st_ == 404, (st_, err))
    return path, blob


def corruption_checks(path, blob, tmp):
    """Part 2: TensorBoard's readers and ours on damaged copies."""
    rc, evs, _ = ours(path)
    offsets = [e["offset"] for e in evs]
    k = 5  # a row's record
    cases = [("a byte of its data", lambda b: b[:offsets[k] + 15] + bytes([b[offsets[k] + 15] ^ 0x20]) + b[offsets[k] + 16:],
              "failed event crc32 check", f"corrupted record at byte {offsets[k]}: failed event crc32 check"),
             ("a byte of its length", lambda b: b[:offsets[k] + 2] + bytes([b[offsets[k] + 2] ^ 0x01]) + b[offsets[k] + 3:],
              "failed header crc32 check", f"corrupted record at byte {offsets[k]}: failed header crc32 check"),
             ("a cut inside its data", lambda b: b[:offsets[k] + 20],
              "has truncated record in data", f"truncated record at byte {offsets[k]} (in data)")]
    logger = logging.getLogger("tensorboard")
    for what, damage, tb_says, we_say in cases:
        bad = os.path.join(tmp, "bad", what.replace(" ", "-"), "events.out.tfevents.bad")
        os.makedirs(os.path.dirname(bad), exist_ok=True)
        open(bad, "wb").write(damage(blob))
        n, msg = tb_records(bad)
        check(f"{what} of record {k}: TensorBoard's record reader raises DataLossError '{tb_says}' after {k} records",
              n == k and msg is not None and tb_says in msg, (n, msg))
        rc, evs, err = ours(bad)
        check(f"... ours: exit 1 after the same {k} events, '{we_say}'",
              rc == 1 and len(evs) == k and we_say in err, (rc, len(evs), err[-300:]))
        seen = []
        h = logging.Handler()
        h.emit = lambda rec: seen.append(rec.getMessage())
        logger.addHandler(h)
        level = logger.level
        logger.setLevel(logging.DEBUG)
        try:
            got = list(efl.RawEventFileLoader(bad).Load())
        finally:
            logger.removeHandler(h)
            logger.setLevel(level)
        check(f"... TensorBoard's loader yields those {k} records and logs '{tb_says}'",
              len(got) == k and any(tb_says in s for s in seen), (len(got), seen[-3:]))


def kill_checks(c, tbdir, tmp):
    """Part 3: kill -9 while a job runs, the directory after it, the restart."""
    sp = spec("tb-kill", 40, 64, 64, 16, 4, checkpoint_every=10, snapshot_every=0)
    jid = c.submit(sp)
    folder = os.path.join(tbdir, f"job-{jid}")
    running = d.wait_for(lambda: c.step(jid) >= 13 or c.job(jid).get("state") in ("succeeded", "failed"), 120)
    at = c.step(jid)
    for n in ("w0", "w1"):  # the job holds still: it cannot end before the kill
        c.signal_worker(n, signal.SIGSTOP)
    check("the job runs (step >= 13 of 40) and its workers are stopped", running and 13 <= at < 40 and
          c.job(jid).get("state") == "running", c.job(jid))
    run1 = c.job(jid).get("run")
    # the run's file catches up with the recorded steps (within a second)
    rows1 = [r for r in d.all_metrics(c, jid)]

    def caught_up():
        files = sorted(f for f in os.listdir(folder) if "tfevents" in f) if os.path.isdir(folder) else []
        if not files:
            return False
        rc, evs, _ = ours(os.path.join(folder, files[-1]))
        return rc == 0 and max((e["step"] for e in evs if "scalars" in e), default=-1) >= rows1[-1]["step"]
    check("the run's file holds every recorded step before the kill", rows1 and d.wait_for(caught_up, 30), rows1[-1:])
    c.kill_coordinator()
    for n in ("w0", "w1"):
        c.signal_worker(n, signal.SIGCONT)
    files = sorted(os.listdir(folder))
    events = [f for f in files if "tfevents" in f]
    check("after kill -9: the directory holds the run's event file, and nothing but a writer's temporary beside it",
          len(events) == 1 and all(re.fullmatch(r"\.pipewright-\d+\.tmp", f) for f in files if f not in events), files)
    for f in events:
        p = os.path.join(folder, f)
        n, msg = tb_records(p)
        rc, evs, err = ours(p)
        check(f"... {f}: TensorBoard's record reader reads {n} whole records to the end, ours the same",
              msg is None and n >= 2 and rc == 0 and len(evs) == n, (n, msg, rc, len(evs), err[-200:]))
    c.start_coordinator()
    job = c.wait_job(jid, timeout=300)
    check("after the restart the job resumes and succeeds", job.get("state") == "succeeded",
          {k: job.get(k) for k in ("state", "error", "run")})
    att = d.attempts(c, jid)
    starts = [a.get("start_step") for a in att]
    check("... in a second run, from its checkpoint", len(att) == 2 and att[0]["run"] == run1 and
          att[1].get("resumed_from") == "checkpoint", att)
    allrows = d.all_metrics(c, jid)
    run1_steps = [r["step"] for r in allrows if r["run"] == run1]
    check("... repeating steps the first run had recorded (what TensorBoard must drop)",
          run1_steps and starts[-1] is not None and max(run1_steps) >= starts[-1], (max(run1_steps or [0]), starts))
    st_, m = d.http(c.base, f"/v1/jobs/{jid}/metrics")
    rows = m.get("metrics", []) if st_ == 200 else []
    check("the metrics API: a row per step 0..39", [r["step"] for r in rows] == list(range(40)), len(rows))
    want = expected(c, jid, rows)
    events = sorted(f for f in os.listdir(folder) if "tfevents" in f)
    check("the directory: one file per run, in run order", len(events) == 2 and events[0].endswith(f".{run1:010d}"),
          events)
    ok_all = True
    for f in events:
        n, msg = tb_records(os.path.join(folder, f))
        ok_all &= msg is None
    check("... every file whole to TensorBoard's record reader", ok_all, events)
    diff = first_diff(scalars(folder), want)
    check("... read by EventAccumulator: the metrics API's rows, step for step (the first run's later steps dropped)",
          not diff, diff)
    st_, blob = d.http(c.base, f"/v1/jobs/{jid}/events.tfevents", raw=True)
    p = os.path.join(tmp, "api-kill", "events.out.tfevents.kill")
    os.makedirs(os.path.dirname(p), exist_ok=True)
    open(p, "wb").write(blob if isinstance(blob, bytes) else b"")
    diff = first_diff(scalars(p), want)
    check("... and so does the API's file of both runs", not diff, diff)
    diff = same_events(p)
    check("... which our reader reads as TensorBoard's loader does", not diff, diff)


def counters(c):
    """(writes, failures) of --tensorboard-dir in /metrics."""
    st_, text = d.http(c.base, "/metrics")
    w = re.search(r"^pipewright_tensorboard_writes_total (\d+)$", str(text), re.M)
    f = re.search(r"^pipewright_tensorboard_write_failures_total (\d+)$", str(text), re.M)
    return (int(w.group(1)) if w else None, int(f.group(1)) if f else None)


def failure_checks(c, tbdir):
    """A write that fails is counted and logged, never silent: the next
    job's folder is taken by a plain file, so its run's file cannot be
    written; the job itself is not held back."""
    before = counters(c)
    check("/metrics: the directory's writes counted, none failed", before[0] and before[0] >= 1 and before[1] == 0,
          before)
    st_, lst = d.http(c.base, "/v1/jobs?limit=1")
    nxt = lst["jobs"][0]["id"] + 1  # ids are handed out in order
    open(os.path.join(tbdir, f"job-{nxt}"), "w").write("in the way\n")
    jid = c.submit(spec("tb-blocked", 4, 16, 16, 8, 2))
    job = c.wait_job(jid)
    check(f"job {jid} succeeds though its event file cannot be written", jid == nxt and job.get("state") == "succeeded",
          (jid, nxt, job.get("state")))
    after = d.wait_for(lambda: (lambda x: x if x[1] and x[1] > 0 else None)(counters(c)), 30)
    log = c.log_text()
    check("... the failed write is counted in /metrics and the log names the job, the run and why",
          after and after[1] >= 1 and re.search(rf"tensorboard: job {jid} run \d+: the event file was not written "
                                                r"\(tried again in 10 s\): .*job-\d+.*Not a directory", log),
          (after, log[-600:]))


def main():
    tmp = tempfile.mkdtemp(prefix="pw-tensorboard-")
    tbdir = os.path.join(tmp, "tb")
    c = d.Cluster(BUILD, tmp, "tb", args=["--tensorboard-dir", tbdir], data_root=SRC)
    try:
        for n in ("w0", "w1"):
            c.start_worker(n)
        check("2 workers idle", c.wait_idle(2))
        jid = c.submit(spec("tb-gpt", 12, 16, 16, 8, 2, checkpoint_every=6, eval_every=4, eval_batches=2))
        job = c.wait_job(jid)
        check("a pp 2 job succeeds", job.get("state") == "succeeded", {k: job.get(k) for k in ("state", "error")})
        path, blob = file_checks(c, jid, tbdir, tmp)
        corruption_checks(path, blob, tmp)
        kill_checks(c, tbdir, tmp)
        failure_checks(c, tbdir)
    finally:
        d.close_cluster(c, tmp, check, lambda: check.failed > 0)
    print(f"{check.passed} passed, {check.failed} failed")
    return 1 if check.failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""host_layout: on one host of many cores, the layout `plan --auto` chooses
(ranks x threads per rank, pp, dp, schedule) against one process using
every core, side by side; and the plan's predicted step against the
measured one (issue 36: the --auto layout at >= 2x the 16-thread process,
the prediction within 10 %).

    /usr/bin/python3 bench/host_layout.py [--bin DIR] [--job bench/jobs/gpt-d768.json]
        [--cores N] [--threads 1,2,4] [--batch 16] [--steps 5] [--warm 2] [--rounds 2]

--bin holds pipewright, pipewright-coordinator and pipewright-worker (a
build folder, or a bundle's bin/: deploy/bundle.sh). Steps:
  1. `pipewright calibrate --threads T` for each T (a profile each);
  2. `pipewright plan --auto --profile ... --cores N`: the chosen layout;
  3. rounds, alternating: `pipewright train --threads N` (one process on
     every core) and the layout on a real coordinator with pp x dp workers
     of T threads on loopback (pinned to disjoint cores by the coordinator),
     warm steps dropped, the rest's step times kept;
  4. the medians, their spread, the ratio, the prediction's error.
Writes bench/results/layout/host-layout.{json,md}."""
import argparse, json, os, shutil, signal, statistics, subprocess, sys, tempfile, time, urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def sh(cmd, env=None, **kw):
    return subprocess.run(cmd, env={**os.environ, **(env or {})}, capture_output=True, text=True, **kw)


def get(base, path):
    with urllib.request.urlopen(base + path, timeout=30) as r:
        return json.loads(r.read())


def post(base, path, body):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def single(bin_, job_file, cores, steps, warm, tmp):
    """Step times (s) of one process on every core, warm steps dropped."""
    log = os.path.join(tmp, "single.jsonl")
    p = sh([os.path.join(bin_, "pipewright"), "train", "--job", job_file, "--threads", str(cores), "--steps",
            str(warm + steps), "--log-json", log, "--quiet"], env={"OPENBLAS_NUM_THREADS": str(cores)}, cwd=ROOT)
    if p.returncode:
        sys.exit(f"pipewright train failed: {p.stderr[-800:]}")
    rows = [json.loads(line) for line in open(log)]
    return [r["ms"] / 1e3 for r in rows[warm:]]


def layout(bin_, spec, row, steps, warm, tmp, tag):
    """Step times (s) of the chosen layout on a real coordinator and workers."""
    ready = os.path.join(tmp, tag + "-ready.json")
    procs = []
    env = {**os.environ, "OPENBLAS_NUM_THREADS": str(row["threads"])}
    coord = subprocess.Popen([os.path.join(bin_, "pipewright-coordinator"), "--http", "127.0.0.1:0", "--control",
                              "127.0.0.1:0", "--state-dir", os.path.join(tmp, tag + "-coord"), "--ready-file", ready,
                              "--data-root", ROOT], stdout=open(os.path.join(tmp, tag + "-coord.log"), "w"),
                             stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    procs.append(coord)
    try:
        for _ in range(300):
            if os.path.exists(ready) and os.path.getsize(ready):
                break
            time.sleep(0.1)
        ports = json.load(open(ready))
        base = f"http://127.0.0.1:{ports['http']}"
        n = row["pp"] * row["dp"]
        for k in range(n):
            procs.append(subprocess.Popen(
                [os.path.join(bin_, "pipewright-worker"), "--coordinator", f"127.0.0.1:{ports['control']}",
                 "--listen", "127.0.0.1:0", "--name", f"w{k}", "--threads", str(row["threads"]),
                 "--state-dir", os.path.join(tmp, f"{tag}-w{k}")],
                stdout=open(os.path.join(tmp, f"{tag}-w{k}.log"), "w"), stderr=subprocess.STDOUT, env=env, cwd=ROOT))
        for _ in range(600):
            idle = [w for w in get(base, "/v1/workers").get("workers", []) if w.get("state") == "idle"]
            if len(idle) >= n:
                break
            time.sleep(0.1)
        s = json.loads(json.dumps(spec))
        s["mesh"] = {"pp": row["pp"], "dp": row["dp"], "virtual_stages": row["virtual_stages"]}
        s["schedule"] = {"name": row["schedule"], "microbatches": row["microbatches"]}
        s["train"]["steps"] = warm + steps
        s["train"]["checkpoint_every"] = 0
        s["train"]["snapshot_every"] = 0
        jid = post(base, "/v1/jobs", s)["id"]
        while True:
            j = get(base, f"/v1/jobs/{jid}")
            if j.get("state") in ("succeeded", "failed", "cancelled"):
                break
            time.sleep(0.5)
        if j["state"] != "succeeded":
            sys.exit(f"the layout's job {j['state']}: {j.get('error')}")
        m = get(base, f"/v1/jobs/{jid}/metrics?since=0").get("metrics", [])
        return [r["step_time"] for r in sorted(m, key=lambda r: r["step"])[warm:]]
    finally:
        for p in procs[1:] + procs[:1]:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "build-release"))
    ap.add_argument("--job", default=os.path.join(HERE, "jobs", "gpt-d768.json"))
    ap.add_argument("--cores", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--threads", default="1,2,4")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warm", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "layout"))
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="pw-layout-")
    spec = json.load(open(a.job))
    spec["train"]["batch_size"] = a.batch
    spec["data"]["path"] = os.path.join(ROOT, spec["data"]["path"])
    job_file = os.path.join(tmp, "job.json")
    json.dump(spec, open(job_file, "w"))
    pw = os.path.join(a.bin, "pipewright")
    threads = [int(t) for t in a.threads.split(",") if int(t) <= a.cores]
    mbs = ",".join(str(1 << k) for k in range(8) if (1 << k) <= a.batch)  # every microbatch size a plan may use
    profiles = []
    for t in threads:
        out = os.path.join(tmp, f"p{t}.json")
        t0 = time.time()
        p = sh([pw, "calibrate", "--job", job_file, "--threads", str(t), "--cores", str(a.cores), "--mb", mbs,
                "--out", out], env={"OPENBLAS_NUM_THREADS": str(t)}, cwd=ROOT)
        if p.returncode:
            sys.exit(f"calibrate --threads {t} failed: {p.stderr[-800:]}")
        print(f"calibrated {t} thread(s) in {time.time() - t0:.0f} s", flush=True)
        profiles += ["--profile", out]
    p = sh([pw, "plan", "--job", job_file, "--auto", *profiles, "--cores", str(a.cores), "--max-pp", "16", "--json"],
           cwd=ROOT)
    if p.returncode:
        sys.exit(f"plan --auto failed: {p.stderr[-800:]}")
    row = json.loads(p.stdout)["chosen"]
    print(f"chosen: {row['pp'] * row['dp']} ranks x {row['threads']} threads (pp {row['pp']}, dp {row['dp']}), "
          f"{row['schedule']} V {row['virtual_stages']} m {row['microbatches']}: predicted "
          f"{row['predicted'] * 1e3:.1f} ms", flush=True)
    one, lay, per_round = [], [], []
    for r in range(a.rounds):  # alternating, so drift hits both alike
        s = single(a.bin, job_file, a.cores, a.steps, a.warm, tmp)
        l = layout(a.bin, spec, row, a.steps, a.warm, tmp, f"r{r}")
        one += s
        lay += l
        per_round.append(statistics.median(s) / statistics.median(l))
        print(f"round {r + 1}: one process {statistics.median(s) * 1e3:.1f} ms, layout "
              f"{statistics.median(l) * 1e3:.1f} ms", flush=True)
    m1, ml = statistics.median(one), statistics.median(lay)
    res = {"cpu": next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")),
                       "?"),
           "cores": a.cores, "job": os.path.basename(a.job), "batch": a.batch, "threads_tried": threads,
           "chosen": row, "one_process_ms": [x * 1e3 for x in one], "layout_ms": [x * 1e3 for x in lay],
           "one_process_median_ms": m1 * 1e3, "layout_median_ms": ml * 1e3, "speedup": m1 / ml,
           "speedup_by_round": per_round, "predicted_ms": row["predicted"] * 1e3,
           "prediction_error": row["predicted"] / ml - 1,
           "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE", "")}
    os.makedirs(a.out, exist_ok=True)
    json.dump(res, open(os.path.join(a.out, "host-layout.json"), "w"), indent=1)
    md = (f"# One host, many cores: the --auto layout against one process\n\n"
          f"{res['cpu']}, {a.cores} cores; {res['job']} at batch {a.batch}; {a.rounds} alternating rounds of "
          f"{a.steps} steps after {a.warm} warm ones; OPENBLAS_CORETYPE={res['openblas_coretype'] or '(unset)'}.\n\n"
          f"| | median step | range |\n|---|---|---|\n"
          f"| one process, {a.cores} threads | {m1 * 1e3:.1f} ms | {min(one) * 1e3:.1f}-{max(one) * 1e3:.1f} |\n"
          f"| {row['pp'] * row['dp']} ranks x {row['threads']} threads (pp {row['pp']}, dp {row['dp']}, "
          f"{row['schedule']}, m {row['microbatches']}) | {ml * 1e3:.1f} ms | {min(lay) * 1e3:.1f}-"
          f"{max(lay) * 1e3:.1f} |\n\n"
          f"Speed-up {m1 / ml:.2f}x (by round: {', '.join(f'{x:.2f}' for x in per_round)}); the plan predicted "
          f"{row['predicted'] * 1e3:.1f} ms, {100 * res['prediction_error']:+.1f} % of the measured step.\n")
    open(os.path.join(a.out, "host-layout.md"), "w").write(md)
    print(md)
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()

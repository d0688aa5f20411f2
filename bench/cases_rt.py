"""cases_rt: the harness's cases that run the worker runtime, the transport and the coordinator
(issue 8 cases 2 pp=2, 3, 4, 5, 6, 7). Called from harness.py; each returns a JSON-able dict/list.
See bench/README.md for what each figure means."""
import json, os, re, shutil, statistics, subprocess, tempfile, time, urllib.request

import pipe

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CORES = os.cpu_count() or 1


def _job(d, L, H, T, B, m, pp, V, sched, steps):
    with open(os.path.join(HERE, "jobs", "gpt-d256.json")) as f:
        j = json.load(f)
    j["name"] = f"bench-gpt-d{d}-L{L}"
    j["model"].update(d_model=d, n_layers=L, n_heads=H, seq_len=T)
    j["mesh"].update(pp=pp, dp=1, virtual_stages=V)
    j["schedule"].update(name=sched, microbatches=m)
    j["train"].update(steps=steps, batch_size=B)
    j["data"]["path"] = os.path.join(ROOT, j["data"]["path"])
    return j


def _med(x):
    return statistics.median(x) if x else None


def _pipeline_row(a, env, job, tag, warmup):
    """One pipeline run: throughput, per-action costs, replayed and measured bubbles, memory samples."""
    out = os.path.join(a.scratch, tag)
    res = pipe.run(a.build, job, out, trace_every=1, env=env)
    steps = job["train"]["steps"]
    period = pipe.step_period(res, warmup)
    # worker step times of the timed steps (not the last: it also tears the run down)
    st = _med([max(rep[k]["step_time"] for rep in res["reports"]) for k in range(warmup, steps - 1)])
    costs = pipe.action_costs(res, warmup)
    rp = pipe.replay(res["plan"]["plan"], lambda k, m, s: costs[(k, s)])
    tokens = job["train"]["batch_size"] * job["model"]["seq_len"]
    mem = []
    pl = res["plan"]
    for r, rep in enumerate(res["reports"]):
        # memory settles later than speed: at pp = 4 a page or two is still made in steps 2-3 (a rank's
        # first early arrivals); the last step also tears the run down
        mem_warm = max(warmup, steps // 3)
        t = [x for x in rep if mem_warm <= x["step"] < steps - 1]
        n = len(t) - 1
        stages = [s for s, x in enumerate(pl["stage_to_rank"]) if x == r]
        params = sum(pl["partition"]["stages"][s]["params"] for s in stages)
        act = max(pl["partition"]["stages"][s]["activation_bytes"] for s in stages)
        peak_act = pl["analytics"]["ranks"][r]["peak_activations"]
        est = pl["analytics"]["ranks"][r].get("memory_bytes")  # the planner's figure (lib/plan/plan.h pw_plan_mem)
        mem.append({"rank": r, "minflt_per_step": (t[-1]["minflt"] - t[0]["minflt"]) / n if n > 0 else None,
                    "rss_growth_per_step": (t[-1]["rss"] - t[0]["rss"]) / n if n > 0 else None,
                    "vmdata_growth_per_step": (t[-1]["vmdata"] - t[0]["vmdata"]) / n if n > 0 else None,
                    "peak_rss": rep[-1].get("hwm"), "plan_estimate": est, "params": params,
                    "activation_bytes": act, "peak_activations_plan": peak_act,
                    "peak_act_measured": max(x.get("peak_act", 0) for x in rep)})
    shutil.rmtree(out, ignore_errors=True)
    return {"schedule": job["schedule"]["name"], "pp": job["mesh"]["pp"], "V": job["mesh"]["virtual_stages"],
            "m": job["schedule"]["microbatches"], "job": job["name"], "steps": steps, "warmup": warmup,
            "memory_warmup": max(warmup, steps // 3),
            "step_period_s": period, "worker_step_time_s": st,
            "tokens_per_s": tokens / period if period else None,
            "replay_makespan_s": rp["makespan"], "replay_bubble": rp["bubble_ratio"],
            "measured_bubble": pipe.measured_bubble(res, warmup),
            "planned_bubble": pl["analytics"]["bubble_ratio"],
            "action_costs_ms": {f"{k}@s{s}": v * 1e3 for (k, s), v in sorted(costs.items())},
            "memory": mem}


def case_pp2_step(a, env):
    """Case 2, pp = 2: the d256 GPT as two 1-thread workers."""
    steps = 8 if a.quick else 16
    job = _job(256, 4, 4, 128, 16, 8, 2, 1, "zb-h1", steps)
    row = _pipeline_row(a, env, job, "pp2-d256", 2)
    row["name"] = "bench-gpt-d256"
    return row


def case_pipeline(a, env):
    """Case 3 (and case 6's memory figures): a GPT d=128 L=8 T=64 B=16, m=8. Three rounds; in each, the
    single-rank baseline then every configuration; each configuration's row is its round with the median
    efficiency (the 2 cores are shared with whatever else runs, so single runs are noisy)."""
    steps = 7 if a.quick else 14
    rounds = 3
    configs = [(pp, sched, V) for pp in (2, 4)
               for sched, V in (("1f1b", 1), ("zb-h1", 1), ("interleaved-1f1b", 2), ("dualpipev", 2))]
    got = {c: [] for c in configs}
    base_periods = []
    for rd in range(rounds):
        base = pipe.run(a.build, _job(128, 8, 4, 64, 16, 8, 1, 1, "1f1b", steps), os.path.join(a.scratch, "pp1"),
                        trace_every=0, env=env)
        shutil.rmtree(os.path.join(a.scratch, "pp1"), ignore_errors=True)
        p1 = pipe.step_period(base, 2)
        base_periods.append(p1)
        for pp, sched, V in configs:
            job = _job(128, 8, 4, 64, 16, 8, pp, V, sched, steps)
            try:
                r = _pipeline_row(a, env, job, f"{sched}-pp{pp}", 2)
            except (RuntimeError, subprocess.CalledProcessError) as e:
                got[(pp, sched, V)].append({"schedule": sched, "pp": pp, "V": V, "m": 8, "error": str(e)[:300]})
                continue
            # ideal: single-rank throughput x min(pp, cores) x (1 - bubble of the replay with measured costs)
            tps1 = 16 * 64 / p1
            r["round"] = rd
            r["single_rank_tokens_per_s"] = tps1
            r["ideal_tokens_per_s"] = tps1 * min(pp, CORES) * (1 - r["replay_bubble"])
            r["efficiency"] = r["tokens_per_s"] / r["ideal_tokens_per_s"]
            got[(pp, sched, V)].append(r)
    rows = []
    for c in configs:
        ok = sorted((r for r in got[c] if "error" not in r), key=lambda r: r["efficiency"])
        if not ok:
            rows.append(got[c][0])
            continue
        r = dict(ok[len(ok) // 2])
        r["efficiency_rounds"] = [x["efficiency"] for x in ok]
        rows.append(r)
    return {"single_rank_period_s": _med(base_periods), "single_rank_periods_s": base_periods, "rounds": rounds,
            "rows": rows}


def case_overhead(a, env, wake):
    """Case 4: tiny transformer (2 layers, d=64, batch 2, T=64, m=1) through the worker vs in-process."""
    steps = 150 if a.quick else 400
    warm = 20
    wake_us = wake["idle_us"]
    out = {"wake_us": wake_us, "wake_hot_us": wake["hot_us"], "rows": []}
    job1 = _job(64, 2, 4, 64, 2, 1, 1, 1, "1f1b", steps)
    d = tempfile.mkdtemp(dir=a.scratch)
    spec = os.path.join(d, "job.json")
    with open(spec, "w") as f:
        json.dump(job1, f)
    inproc = []
    for rep in range(2 if a.quick else 3):
        for pp in (1, 2):
            job = _job(64, 2, 4, 64, 2, 1, pp, 1, "1f1b", steps)
            res = pipe.run(a.build, job, os.path.join(d, f"w{pp}"), trace_every=0, env=env)
            st = _med([max(rep_[k]["step_time"] for rep_ in res["reports"]) for k in range(warm, steps - 1)])
            out["rows"].append({"pp": pp, "round": rep, "worker_step_s": st,
                                "period_s": pipe.step_period(res, warm),
                                "actions_per_step": sum(len(x.split()) for x in res["plan"]["plan"]["ranks"])})
        log = os.path.join(d, "train.jsonl")
        subprocess.run([os.path.join(a.build, "pipewright"), "train", "--job", spec, "--log-json", log, "--quiet",
                        "--threads", "1"], check=True, env=env, cwd=ROOT, capture_output=True)
        with open(log) as f:
            ms = [json.loads(x)["ms"] for x in f if x.strip()]
        inproc.append(_med(ms[warm:-1]))
    # where the worker's step goes: its actions' own time (traced) vs the rest
    res = pipe.run(a.build, job1, os.path.join(d, "traced"), trace_every=1, env=env)
    rep = [x for x in res["reports"][0] if warm <= x["step"] < steps - 1]
    out["pp1_traced"] = {"step_s": _med([x["step_time"] for x in rep]),
                         "actions_s": _med([sum(t1 - t0 for *_, t0, t1 in x["actions"]) for x in rep]),
                         "first_action_start_s": _med([min(x[3] for x in r["actions"]) for r in rep]),
                         "last_action_end_s": _med([max(x[4] for x in r["actions"]) for r in rep]),
                         "gap_between_actions_s": _med([sum(r["actions"][i + 1][3] - r["actions"][i][4]
                                                            for i in range(len(r["actions"]) - 1)) for r in rep])}
    shutil.rmtree(d, ignore_errors=True)
    out["inproc_step_s"] = _med(inproc) * 1e-3
    out["inproc_rounds_ms"] = inproc
    for pp in (1, 2):
        rs = [r for r in out["rows"] if r["pp"] == pp]
        w = _med([r["worker_step_s"] for r in rs])
        n = rs[0]["actions_per_step"]
        ov = w - out["inproc_step_s"]
        out[f"pp{pp}"] = {"worker_step_s": w, "overhead_us_per_step": ov * 1e6, "actions": n,
                          "overhead_us_per_action": ov * 1e6 / n,
                          "over_wake_us_per_action": ov * 1e6 / n - wake_us}
    return out


def _bt(a, *args):
    r = subprocess.run([os.path.join(a.build, "bench", "bench_transport")] + [str(x) for x in args],
                       capture_output=True, text=True, check=True)
    return json.loads(r.stdout)


def case_wake(a):
    """Blocking wake-up between processes: hot (pipe ping-pong) and of a process blocked 1 ms (idle CPU)."""
    return {"hot_us": _med([_bt(a, "wake", 5000)["us_per_wakeup"] for _ in range(3)]),
            "idle_us": _med([_bt(a, "wakeidle", 300)["us_per_wakeup"] for _ in range(3)])}


def case_transport(a):
    rounds = 3 if a.quick else 7
    rows = []
    for size, iters in ((65536, 400), (1 << 20, 60), (16 << 20, 8 if a.quick else 16)):
        for mode in ("pingpong", "stream"):
            pw, raw = [], []
            for i in range(rounds):  # A B B A
                order = ("pw", "raw") if i % 2 == 0 else ("raw", "pw")
                for k in order:
                    r = _bt(a, k, size, iters, *(["stream"] if mode == "stream" else []))
                    (pw if k == "pw" else raw).append(r["us_per_msg"])
            p, q = _med(pw), _med(raw)
            rows.append({"size": size, "mode": mode, "iters": iters, "pw_us": p, "raw_us": q,
                         "pw_gbytes_per_s": size / p * 1e-3, "raw_gbytes_per_s": size / q * 1e-3, "ratio": q / p,
                         "pw_rounds_us": pw, "raw_rounds_us": raw})
    hop_pw = _med([_bt(a, "pw", 0, 2000)["us_per_msg"] for _ in range(rounds)])
    hop_raw = _med([_bt(a, "raw", 0, 2000)["us_per_msg"] for _ in range(rounds)])
    return {"rows": rows, "hop_latency_us_pw": hop_pw / 2, "hop_latency_us_raw": hop_raw / 2}


def _wrk(url, secs):
    r = subprocess.run(["wrk", "-t1", "-c4", f"-d{secs}s", "--latency", url], capture_output=True, text=True,
                       timeout=secs + 30)
    o = r.stdout
    res = {"raw": o}
    m = re.search(r"Requests/sec:\s+([\d.]+)", o)
    res["rps"] = float(m.group(1)) if m else None
    m = re.search(r"(\d+) requests in", o)
    res["requests"] = int(m.group(1)) if m else None
    unit = {"us": 1e-3, "ms": 1.0, "s": 1e3}
    for p in ("50", "75", "90", "99"):
        m = re.search(rf"^\s+{p}%\s+([\d.]+)(us|ms|s)\s*$", o, re.M)
        res[f"p{p}_ms"] = float(m.group(1)) * unit[m.group(2)] if m else None
    m = re.search(r"Non-2xx or 3xx responses: (\d+)", o)
    err = int(m.group(1)) if m else 0
    m = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", o)
    if m:
        err += sum(int(x) for x in m.groups())
    res["errors"] = err
    return res


def case_control(a):
    if not shutil.which("wrk"):
        return {"error": "wrk is not installed (apt-get install wrk)"}
    d = tempfile.mkdtemp(dir=a.scratch)
    ready = os.path.join(d, "ready.json")
    p = subprocess.Popen([os.path.join(a.build, "pipewright-coordinator"), "--http", "127.0.0.1:0", "--control",
                          "127.0.0.1:0", "--state-dir", d, "--ready-file", ready, "--log-level", "warn",
                          "--data-root", ROOT],
                         stdout=subprocess.DEVNULL, stderr=open(os.path.join(d, "log"), "w"))
    try:
        for _ in range(100):
            if os.path.exists(ready) and os.path.getsize(ready):
                break
            time.sleep(0.1)
        port = json.load(open(ready))["http"]
        api = f"http://127.0.0.1:{port}"
        with open(os.path.join(ROOT, "examples", "jobs", "gpt-tiny.json"), "rb") as f:
            req = urllib.request.Request(api + "/v1/jobs", data=f.read(), method="POST")
            jid = json.loads(urllib.request.urlopen(req).read())["id"]
        secs = 5 if a.quick else 10
        out = {"job_id": jid, "seconds": secs, "connections": 4, "threads": 1}
        out["jobs"] = _wrk(f"{api}/v1/jobs/{jid}", secs)
        out["metrics"] = _wrk(f"{api}/metrics", secs)
        return out
    finally:
        p.terminate()
        p.wait(timeout=20)
        shutil.rmtree(d, ignore_errors=True)

"""cases_rt: the harness's cases that run the worker runtime, the transport and the coordinator
(issue 8 cases 2 pp=2, 3, 4, 5, 6, 7). Called from harness.py; each returns a JSON-able dict/list.
See bench/README.md for what each figure means."""
import json, os, re, shutil, statistics, subprocess, tempfile, time, urllib.request

import pipe
import trace_step
from benchlib import Server, env_for, log, spread, torch_cmd, torch_env

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


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
        # from the timed steps on, as speed (test_steady_memory holds the worker to it); the last step
        # also tears the run down
        t = [x for x in rep if warmup <= x["step"] < steps - 1]
        n = len(t) - 1
        stages = [s for s, x in enumerate(pl["stage_to_rank"]) if x == r]
        params = sum(pl["partition"]["stages"][s]["params"] for s in stages)
        act = max(pl["partition"]["stages"][s]["activation_bytes"] for s in stages)
        peak_act = pl["analytics"]["ranks"][r]["peak_activations"]
        est = pl["analytics"]["ranks"][r].get("memory_bytes")  # the planner's figure (common/plan/plan.h pw_plan_mem)
        mem.append({"rank": r, "minflt_per_step": (t[-1]["minflt"] - t[0]["minflt"]) / n if n > 0 else None,
                    "rss_growth_per_step": (t[-1]["rss"] - t[0]["rss"]) / n if n > 0 else None,
                    "vmdata_growth_per_step": (t[-1]["vmdata"] - t[0]["vmdata"]) / n if n > 0 else None,
                    "peak_rss": rep[-1].get("hwm"), "plan_estimate": est, "params": params,
                    "activation_bytes": act, "peak_activations_plan": peak_act,
                    "peak_act_measured": max(x.get("peak_act", 0) for x in rep)})
    shutil.rmtree(out, ignore_errors=True)
    return {"schedule": job["schedule"]["name"], "pp": job["mesh"]["pp"], "V": job["mesh"]["virtual_stages"],
            "m": job["schedule"]["microbatches"], "job": job["name"], "steps": steps, "warmup": warmup,
            "memory_warmup": warmup,
            "step_period_s": period, "worker_step_time_s": st,
            "tokens_per_s": tokens / period if period else None,
            "replay_makespan_s": rp["makespan"], "replay_bubble": rp["bubble_ratio"],
            "measured_bubble": pipe.measured_bubble(res, warmup),
            "planned_bubble": pl["analytics"]["bubble_ratio"],
            "action_costs_ms": {f"{k}@s{s}": v * 1e3 for (k, s), v in sorted(costs.items())},
            "memory": mem}


PP2_MODELS = {  # name: (d, layers, heads, T, B, bench job of the same model at pp = 1)
    "bench-gpt-d256": (256, 4, 4, 128, 16, "bench/jobs/gpt-d256.json"),
    "bench-gpt-d768": (768, 12, 12, 256, 8, "bench/jobs/gpt-d768.json"),
}


def case_pp2(a, env):
    """Case 2 (pp = 2) and issue 16 part 4: a model as a pp = 2 pipeline of two 1-thread workers
    (zb-h1 and 1f1b, m = 8) against the same model in one process on 2 OpenBLAS threads (its best
    setting: m = 1), and against PyTorch on 2 threads (its best wait policy), in the same rounds:
    each round runs both pipelines, then K steps of each resident single-process trainer (idle,
    blocked on stdin, while the pipelines run). Efficiency = pipeline tokens/s ÷ (1-thread single
    process tokens/s × 2 ranks), the 1-thread figure also measured in the round."""
    rounds = 3
    steps, K = (6, 2) if a.quick else (8, 4)
    warm = 2
    names = ["bench-gpt-d256"] if a.quick else list(PP2_MODELS)
    out = {}
    for name in names:
        d, L, H, T, B, path = PP2_MODELS[name]
        tokens = B * T
        env_t, policy = torch_env(a, path, 2)
        bench_step = os.path.join(a.build, "bench", "bench_step")
        sv = {"single_2t": Server([bench_step, "--job", path, "--threads", "2"], env_for(2, a.coretype)),
              "single_1t": Server([bench_step, "--job", path, "--threads", "1"], env),
              "torch_2t": Server(torch_cmd(path, 2), env_t)}
        got = {k: [] for k in ("zb-h1", "1f1b", *sv)}
        runs = {}
        try:
            for s in sv.values():
                s.step()
            for rd in range(rounds):
                log(f"case 2 pp = 2: {name}, round {rd + 1} of {rounds}")
                for sched in ("zb-h1", "1f1b"):
                    job = _job(d, L, H, T, B, 8, 2, 1, sched, steps)
                    r = _pipeline_row(a, env, job, f"pp2-{name}-{sched}", warm)
                    got[sched].append(r["step_period_s"] * 1e3)
                    runs.setdefault(sched, []).append(r)
                for k, s in sv.items():
                    got[k].append(_med([s.step() for _ in range(K)]))
        finally:
            for s in sv.values():
                s.close()
        rows = []
        for sched in ("zb-h1", "1f1b"):
            per = [{"vs_single_2t": s2 / p, "vs_torch_2t": t2 / p, "efficiency": s1 / (2 * p)}
                   for p, s2, t2, s1 in zip(got[sched], got["single_2t"], got["torch_2t"], got["single_1t"])]
            r = dict(sorted(runs[sched], key=lambda x: x["step_period_s"])[len(runs[sched]) // 2])
            row = {"schedule": sched, "m": 8, "rounds_ms": got[sched], "ms": _med(got[sched]),
                   "tokens_per_s": tokens / _med(got[sched]) * 1e3,
                   "measured_bubble": r["measured_bubble"], "planned_bubble": r["planned_bubble"],
                   "replay_bubble": r["replay_bubble"], "memory": r["memory"], "job": r["job"], "pp": 2,
                   "action_costs_ms": r["action_costs_ms"]}
            for key in ("vs_single_2t", "vs_torch_2t", "efficiency"):
                v = [x[key] for x in per]
                row[key], row[key + "_rounds"], row[key + "_spread"] = _med(v), v, spread(v)
            rows.append(row)
        out[name] = {"rounds": rounds, "pipeline_steps": steps, "warmup": warm, "single_steps_per_round": K,
                     "torch_omp_wait_policy": policy, "tokens_per_step": tokens,
                     "single_2t_ms": _med(got["single_2t"]), "single_1t_ms": _med(got["single_1t"]),
                     "torch_2t_ms": _med(got["torch_2t"]), "single_rounds_ms": {k: got[k] for k in sv},
                     "rows": rows}
    return {"models": out}


def case_pipeline(a, env):
    """Case 3 (and case 6's memory figures): a GPT d=128 L=8 T=64 B=16, m=8. Three rounds; in each, the
    single-rank baseline then every configuration; each configuration's row is its round with the median
    efficiency, the rounds' range beside it. Efficiency = measured tokens/s ÷ (single-rank tokens/s ×
    ranks): what the ranks deliver of what they would alone, the bubble and the sharing of cores both
    counted against it (pp = 4 on 2 cores cannot exceed 0.5)."""
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
            tps1 = 16 * 64 / p1
            r["round"] = rd
            r["single_rank_tokens_per_s"] = tps1
            r["ideal_tokens_per_s"] = tps1 * pp
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


def case_overhead(a, env):
    """Case 4: tiny transformer (2 layers, d=64, batch 2, T=64, m=1) through the worker vs in-process.
    Each round takes its own wake-up figure (`bench_transport wakeidle`) beside its runs, so the
    per-action overhead above one wake-up is a difference of figures measured together; the rounds'
    range is reported beside the median. The job's default snapshot_every 1 gives the figures; the same
    runs with snapshot_every 0, in the same rounds, say what the snapshots cost. A traced pp = 2 run is
    split per rank as bench/trace_step.py does."""
    steps = 150 if a.quick else 400
    warm = 20
    rounds = 3 if a.quick else 5
    out = {"rows": [], "rounds": rounds}
    job1 = _job(64, 2, 4, 64, 2, 1, 1, 1, "1f1b", steps)
    d = tempfile.mkdtemp(dir=a.scratch)
    spec = os.path.join(d, "job.json")
    with open(spec, "w") as f:
        json.dump(job1, f)
    inproc, wakes, hot = [], [], []
    for rep in range(rounds):
        wakes.append(_bt(a, "wakeidle", 300)["us_per_wakeup"])
        hot.append(_bt(a, "wake", 5000)["us_per_wakeup"])
        # snapshot_every 1 is the job's default (the figure); 0 beside it says what the snapshots cost
        for pp, snap in ((1, 1), (2, 1), (1, 0), (2, 0)):
            job = _job(64, 2, 4, 64, 2, 1, pp, 1, "1f1b", steps)
            job["train"]["snapshot_every"] = snap
            res = pipe.run(a.build, job, os.path.join(d, f"w{pp}"), trace_every=0, env=env)
            st = _med([max(rep_[k]["step_time"] for rep_ in res["reports"]) for k in range(warm, steps - 1)])
            out["rows"].append({"pp": pp, "snapshot_every": snap, "round": rep, "worker_step_s": st,
                                "period_s": pipe.step_period(res, warm),
                                "actions_per_step": sum(len(x.split()) for x in res["plan"]["plan"]["ranks"])})
        log_path = os.path.join(d, "train.jsonl")
        subprocess.run([os.path.join(a.build, "pipewright"), "train", "--job", spec, "--log-json", log_path,
                        "--quiet", "--threads", "1"], check=True, env=env, cwd=ROOT, capture_output=True)
        with open(log_path) as f:
            ms = [json.loads(x)["ms"] for x in f if x.strip()]
        inproc.append(_med(ms[warm:-1]) * 1e-3)
    # where the pp = 2 step goes, per rank (bench/trace_step.py's split of the traced reports)
    res = pipe.run(a.build, _job(64, 2, 4, 64, 2, 1, 2, 1, "1f1b", steps), os.path.join(d, "traced2"),
                   trace_every=1, env=env)
    try:
        out["pp2_traced"] = [{k: v for k, v in row.items() if k != "stages"}
                             for row in trace_step.per_rank(res, warm, steps)]
    except (RuntimeError, KeyError):  # a worker without the step reports' trace
        pass
    # where the worker's step goes: its actions' own time (traced) vs the rest
    res = pipe.run(a.build, job1, os.path.join(d, "traced"), trace_every=1, env=env)
    # a step that found no free trace buffer went untraced
    rep = [x for x in res["reports"][0] if warm <= x["step"] < steps - 1 and "actions" in x]
    out["pp1_traced"] = {"step_s": _med([x["step_time"] for x in rep]),
                         "actions_s": _med([sum(t1 - t0 for *_, t0, t1 in x["actions"]) for x in rep]),
                         "first_action_start_s": _med([min(x[3] for x in r["actions"]) for r in rep]),
                         "last_action_end_s": _med([max(x[4] for x in r["actions"]) for r in rep]),
                         "gap_between_actions_s": _med([sum(r["actions"][i + 1][3] - r["actions"][i][4]
                                                            for i in range(len(r["actions"]) - 1)) for r in rep])}
    shutil.rmtree(d, ignore_errors=True)
    out["inproc_step_s"] = _med(inproc)
    out["inproc_rounds_s"] = inproc
    out["wake_us"], out["wake_rounds_us"] = _med(wakes), wakes
    out["wake_hot_us"] = _med(hot)
    for pp, snap in ((1, 1), (2, 1), (1, 0), (2, 0)):
        rs = sorted((r for r in out["rows"] if r["pp"] == pp and r["snapshot_every"] == snap), key=lambda r: r["round"])
        n = rs[0]["actions_per_step"]
        ov = [(r["worker_step_s"] - inproc[r["round"]]) * 1e6 for r in rs]
        above = [o / n - wakes[r["round"]] for o, r in zip(ov, rs)]
        out[f"pp{pp}" + ("" if snap else "_nosnap")] = {"worker_step_s": _med([r["worker_step_s"] for r in rs]), "actions": n,
                          "overhead_us_per_step": _med(ov), "overhead_us_per_step_spread": spread(ov),
                          "overhead_us_per_action": _med(ov) / n,
                          "over_wake_us_per_action": _med(above), "over_wake_spread": spread(above),
                          "over_wake_rounds": above}
    return out


def _bt(a, *args):
    r = subprocess.run([os.path.join(a.build, "bench", "bench_transport")] + [str(x) for x in args],
                       capture_output=True, text=True, check=True)
    return json.loads(r.stdout)


def case_transport(a):
    """pw frames against the best raw path: blocking raw sockets and busy-polled raw sockets (neither end
    ever sleeps), interleaved in rotating order; ratio = the faster raw path's time ÷ pw's."""
    rounds = 3 if a.quick else 7
    kinds = ("pw", "raw", "spin")
    rows = []
    for size, iters in ((65536, 400), (1 << 20, 60), (16 << 20, 8 if a.quick else 16)):
        for mode in ("pingpong", "stream"):
            got = {k: [] for k in kinds}
            for i in range(rounds):
                for k in kinds[i % 3:] + kinds[:i % 3]:
                    r = _bt(a, k, size, iters, *(["stream"] if mode == "stream" else []))
                    got[k].append(r["us_per_msg"])
            p, q, sp = _med(got["pw"]), _med(got["raw"]), _med(got["spin"])
            best = min(q, sp)
            per = [min(x, y) / z for x, y, z in zip(got["raw"], got["spin"], got["pw"])]
            rows.append({"size": size, "mode": mode, "iters": iters, "pw_us": p, "raw_us": q, "spin_us": sp,
                         "best_raw": "spin" if sp < q else "raw",
                         "pw_gbytes_per_s": size / p * 1e-3, "raw_gbytes_per_s": size / best * 1e-3,
                         "ratio": _med(per), "ratio_spread": spread(per),
                         "rounds_us": got})
    hop = {k: _med([_bt(a, k, 0, 2000)["us_per_msg"] for _ in range(rounds)]) / 2 for k in kinds}
    return {"rows": rows, "hop_latency_us_pw": hop["pw"], "hop_latency_us_raw": hop["raw"],
            "hop_latency_us_spin": hop["spin"]}


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

#!/usr/bin/env python3
"""test_tensor_parallel: stages run on tp groups of real pipewright-worker
processes on 127.0.0.1 (driver.py plays the coordinator; the last case a
real coordinator), against `pipewright train` of the same job at tp = 1.

  - the mesh x schedule x model matrix, its tolerances and what they
    measure: test_tp_matrix.py, which drives its jobs with Run below;
  - the bytes each worker sends per step in the tp all-reduces equal the
    planner's tp_bytes_per_step of its pipeline rank, every step (Run, used
    by both files);
  - a checkpoint written at tp 2 resumed at tp 1, and one written at tp 1
    resumed at tp 2: the losses continue as the uninterrupted run's to 1e-5
    relative and every final tensor equals its to 1e-4 of its largest value
    (SGD with momentum);
  - every schedule's plan at tp 2 passes the simulator (pipewright plan);
  - on a real coordinator and 2 workers a tp 2 job succeeds, its metrics
    equal the reference, and the workers list shows each one's place
    (stage group, replica, tp rank); a tp 2 job with partition.remat
    "full" and train.eval_every 3 equals the reference's losses, its
    eval_loss is `pipewright eval` of its checkpoints, and its job view
    says in-memory snapshots are off (tensor parallel).
Prints the largest differences seen. Usage: BUILD_DIR SOURCE_DIR"""
import json, os, re, subprocess, sys, tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ref"))
import numpy as np  # noqa: E402
import st  # noqa: E402
from test_pipeline import Suite  # noqa: E402
import driver as d  # noqa: E402

SCHEDULES = ["gpipe", "1f1b", "eager1f1b", "zb-h1", "interleaved-1f1b", "interleaved-gpipe",
             "interleaved-1f1b-plus-one", "dualpipev", "kimi-k2"]


def spec_of(name, pp, V, dp, tp, model="gpt", tied=False, steps=6, m=4, layers=4):
    mdl = {"template": model, "vocab_size": 256, "seq_len": 16, "d_model": 32, "n_layers": layers, "n_heads": 2}
    if model == "gpt":
        mdl["tie_embeddings"] = tied
    return {"name": f"tp-{name}", "model": mdl, "mesh": {"pp": pp, "dp": dp, "tp": tp, "virtual_stages": V},
            "schedule": {"name": name, "microbatches": m},
            "train": {"steps": steps, "batch_size": m * dp * 2, "seed": 3, "grad_clip": 1.0, "snapshot_every": 0,
                      "optimizer": {"name": "sgd", "lr": 0.05, "momentum": 0.9, "warmup_steps": 3,
                                    "weight_decay": 0.01}},
            "data": {"kind": "text", "path": "examples/data/corpus.txt", "sampler": "sequential"}}


def at_tp(spec, tp):
    s = json.loads(json.dumps(spec))
    s["mesh"]["tp"] = tp
    return s


def reference(build, src, tmp, spec, tag):
    dd = os.path.join(tmp, f"ref-{tag}")
    os.makedirs(dd, exist_ok=True)
    path = os.path.join(dd, "job.json")
    json.dump(at_tp(spec, 1), open(path, "w"))
    subprocess.run([os.path.join(build, "pipewright"), "train", "--job", path, "--quiet", "--log-json",
                    os.path.join(dd, "ref.jsonl"), "--out", os.path.join(dd, "ref.safetensors")], check=True, cwd=src)
    return [json.loads(ln) for ln in open(os.path.join(dd, "ref.jsonl"))], st.load(os.path.join(dd, "ref.safetensors"))[0]


def weight_diff(got, ref):
    """(worst per-tensor max|a-b| / max|b|, its tensor); inf when names or shapes differ."""
    worst = (0.0, "")
    if sorted((k, tuple(np.shape(v))) for k, v in got.items()) != sorted((k, tuple(np.shape(v))) for k, v in ref.items()):
        return float("inf"), "names or shapes differ"
    for k in ref:
        x, y = np.asarray(got[k], np.float64), np.asarray(ref[k], np.float64)
        worst = max(worst, (float(np.max(np.abs(x - y)) / (np.max(np.abs(y)) + 1e-30)), k))
    return worst


class Run:
    def __init__(self, build, src, tmp):
        self.build, self.src, self.tmp = build, src, tmp
        self.t = Suite(build, src, tmp)
        self.max_loss, self.max_w = 0.0, 0.0

    def check_equal(self, label, res, ref_log, ref_w, start=0):
        worst = 0.0
        for e in ref_log[start:]:
            got = res["losses"].get(str(e["step"]))
            rel = abs(got - e["loss"]) / abs(e["loss"]) if got is not None else float("inf")
            worst = max(worst, rel)
        wrel, wname = weight_diff(st.load(res["merged"])[0], ref_w)
        self.max_loss = max(self.max_loss, worst)
        self.max_w = max(self.max_w, wrel)
        self.t.check(f"{label}: losses and weights equal the tp = 1 run", worst <= 1e-5 and wrel <= 1e-4,
                     f"losses {worst:.2e} (1e-5), weights {wrel:.2e} at {wname} (1e-4)")

    def check_bytes(self, label, res, outdir, spec):
        plan = json.load(open(os.path.join(outdir, "plan.json")))
        ranks = plan["analytics"]["ranks"]
        pp, dp, tp = spec["mesh"]["pp"], spec["mesh"]["dp"], spec["mesh"]["tp"]
        sent = res.get("tp_bytes", {})
        ok, why = len(sent) == pp * dp * tp, f"{len(sent)} workers reported"
        for w in range(pp * dp * tp):
            want = ranks[w // tp % pp]["tp_bytes_per_step"]
            got = set(sent.get(str(w), {}).values())
            ok &= got == {want} and want > 0
            if got != {want}:
                why += f"; worker {w}: {sorted(got)} vs plan {want}"
        self.t.check(f"{label}: tp bytes per step = the plan's, every worker, every step", ok,
                     why + f" (pipeline rank 0: {ranks[0]['tp_bytes_per_step']} B)")

    def drive(self, label, spec, *extra):
        p, res, dd = self.t.drive(label, spec, *extra)
        ok = p.returncode == 0 and res is not None and res["done"] and not res["errors"] and \
            res["exit_codes"] == [0] * len(res["exit_codes"])
        self.t.check(f"{label}: run completes on {len(res['exit_codes']) if res else '?'} workers, which exit cleanly", ok,
                     (p.stdout + p.stderr)[-800:])
        return res if ok else None, os.path.join(dd, "out")

    def resume(self, first, then):
        label = f"resume-tp{first}-as-tp{then}"
        spec = spec_of("zb-h1", 2, 1, 1, first, steps=8)
        spec["train"]["checkpoint_every"] = 4
        res, out = self.drive(f"{label}-first", spec)
        if not res:
            return
        mid = os.path.join(out, "ckpt", "job-1", "step-4")
        shapes = {k: tuple(np.shape(v)) for k, v in st.load(os.path.join(mid, "stage-0.safetensors"))[0].items()}
        self.t.check(f"{label}: the tp {first} checkpoint has tp = 1 shapes",
                     shapes.get("embed.tok.weight") == (256, 32) and shapes.get("blocks.0.attn.qkv.weight") == (96, 32),
                     str(sorted(shapes.items())[:4]))
        log, w = reference(self.build, self.src, self.tmp, spec, label)
        res2, _ = self.drive(label, at_tp(spec, then), "--resume", mid, "--start-step", "4")
        if res2:
            self.check_equal(label, res2, log, w, start=4)


def plans_at_tp2(r):
    bad = []
    for name in SCHEDULES:
        V = 2 if name.startswith("interleaved") or name in ("dualpipev", "kimi-k2") else 1
        spec = spec_of(name, 2, V, 1, 2, m=4)
        path = os.path.join(r.tmp, f"plan-{name}.json")
        json.dump(spec, open(path, "w"))
        p = subprocess.run([os.path.join(r.build, "pipewright"), "plan", "--job", path, "--json"], capture_output=True,
                           text=True, cwd=r.src)
        try:
            ok = p.returncode == 0 and json.loads(p.stdout)["analytics"]["ranks"][0]["tp_bytes_per_step"] > 0
        except (ValueError, KeyError, IndexError):
            ok = False
        if not ok:
            bad.append(f"{name}: {p.stderr.strip()[-200:]}")
    r.t.check("every schedule's plan at tp 2 passes the simulator", not bad, "; ".join(bad))


def on_cluster(r):
    c = d.Cluster(r.build, r.tmp, "tpc", data_root=r.src)
    for i in range(2):
        c.start_worker(f"w{i}")
    r.t.check("cluster: 2 workers idle", c.wait_idle(2))
    spec = spec_of("1f1b", 1, 1, 1, 2)
    spec["data"]["path"] = os.path.join(r.src, spec["data"]["path"])
    jid = c.submit(spec)
    job = c.wait_job(jid)
    ok = r.t.check("cluster: a tp 2 job succeeds", job.get("state") == "succeeded", str((job.get("state"), job.get("error"))))
    if ok:
        log, _ = reference(r.build, r.src, r.tmp, spec, "cluster")
        got = {m["step"]: m["loss"] for m in d.all_metrics(c, jid)}
        worst = max(abs(got[e["step"]] - e["loss"]) / abs(e["loss"]) for e in log)
        r.t.check("cluster: its losses equal the tp = 1 run's (1e-5)", worst <= 1e-5, f"{worst:.2e}")
        rows = d.http(c.base, "/v1/workers")[1]
        rows = rows.get("workers", rows) if isinstance(rows, dict) else rows
        jr = d.http(c.base, f"/v1/jobs/{jid}")[1].get("ranks", [])
        places = sorted((x["coordinate"]["pipeline_rank"], x["coordinate"]["replica"], x["coordinate"]["tp_rank"],
                         x["stages"]) for x in jr)
        r.t.check("cluster: the job's ranks show each one's coordinate and stages",
                  places == [(0, 0, 0, [0]), (0, 0, 1, [0])], str(jr)[:400])
    # tp with remat and train.eval_every, snapshots left at their default (1): the job view says they are off
    spec = spec_of("1f1b", 1, 1, 1, 2)
    spec["name"], spec["partition"] = "tp-remat-eval", {"mode": "even", "remat": "full"}
    spec["train"].update(eval_every=3, eval_batches=2, checkpoint_every=3)
    del spec["train"]["snapshot_every"]
    spec["data"]["path"] = os.path.join(r.src, spec["data"]["path"])
    jid = c.submit(spec)
    job = c.wait_job(jid)
    if r.t.check("cluster: a tp 2 job with remat full and eval_every 3 succeeds", job.get("state") == "succeeded",
                 str((job.get("state"), job.get("error")))):
        sn = job.get("snapshots") or {}
        r.t.check("cluster: its job view says snapshots are off under tensor parallel",
                  sn.get("every") == 0 and "tensor-parallel" in (sn.get("note") or ""), str(sn))
        log, _ = reference(r.build, r.src, r.tmp, spec, "cluster-remat-eval")
        rows = {m["step"]: m for m in d.all_metrics(c, jid)}
        worst = max(abs(rows[e["step"]]["loss"] - e["loss"]) / abs(e["loss"]) for e in log)
        r.t.check("cluster: the remat + eval job's losses equal the tp = 1 run's (1e-5)", worst <= 1e-5, f"{worst:.2e}")
        evals = {}
        for k in (2, 5):
            st_, blob = d.http(c.base, f"/v1/jobs/{jid}/checkpoint?step={k + 1}", raw=True)
            ck, jf = os.path.join(r.tmp, f"ev-{k}.safetensors"), os.path.join(r.tmp, f"ev-{k}.json")
            open(ck, "wb").write(blob if st_ == 200 else b"")
            json.dump(at_tp(spec, 1), open(jf, "w"))
            p = subprocess.run([os.path.join(r.build, "pipewright"), "eval", "--job", jf, "--checkpoint", ck],
                               capture_output=True, text=True, env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
            m = re.search(r"eval loss ([0-9.]+)", p.stdout)
            evals[k] = (rows.get(k, {}).get("eval_loss"), float(m.group(1)) if m else p.stdout + p.stderr)
        r.t.check("cluster: its eval_loss at steps 3 and 6 is `pipewright eval` on that checkpoint at tp 1 (1e-5)",
                  all(isinstance(g, float) and isinstance(w, float) and abs(g - w) <= 1e-5 * abs(w) + 5e-7
                      for g, w in evals.values()) and all(rows[k].get("eval_loss") is None for k in rows if k not in (2, 5)),
                  str(evals))
    d.close_cluster(c, r.tmp, lambda label, ok, detail="": r.t.check(label, ok, str(detail)), lambda: r.t.failed > 0)


def main():
    build, src = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    with tempfile.TemporaryDirectory(prefix="pw-tp-") as tmp:
        r = Run(build, src, tmp)
        r.resume(2, 1)
        r.resume(1, 2)
        plans_at_tp2(r)
        on_cluster(r)
        print(f"largest differences from tp = 1: losses {r.max_loss:.2e}, weights {r.max_w:.2e}, relative")
        print(f"{r.t.passed} passed, {r.t.failed} failed")
        return 1 if r.t.failed else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""test_regions_pipeline: a two-tower (regions) job across real pipewright-worker
processes on 127.0.0.1, driven by driver.py, against the single-process
trainer: a text tower and a vision tower on ranks of their own, each under
its own schedule, fused into a head region on a fifth rank.

  - text 1f1b (pp 2) + vision zb-h1 (pp 2) + head 1f1b (pp 1): per-step
    losses and final parameters equal `pipewright train`'s (compare_run.py,
    in practice to the last bit), and so does the same job with the regions
    run one after another on two ranks (schedule.regions "serial");
  - other schedule combinations (gpipe, interleaved-1f1b with V 2, zb-h1),
    an add fusion, and two replicas of every region (dp 2, 10 workers):
    the same bits;
  - schedules that cannot meet (a gpipe head after an interleaved tower):
    refused at plan time, naming model.regions and the deadlock;
  - each rank ran only its own region's stages (the fusion stage on the
    head's rank), as the plan placed them;
  - the first job through a real coordinator and 5 workers: the metrics'
    losses and the downloaded checkpoint equal the single-process run's,
    to the last bit, and its timeline's planned lanes name their regions.
Usage: test_regions_pipeline.py BUILD_DIR SOURCE_DIR [--quick]"""
import json, os, subprocess, sys, tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "ref"))
import driver  # noqa: E402
import st  # noqa: E402
PY = "/usr/bin/python3"


def job(text_sched, vision_sched, head_sched="1f1b", text_v=1, fusion="concat", serial=False, steps=6):
    blocks = []
    for k in range(2 * text_v):
        if k:
            blocks.append({"stage_boundary": {}})
        blocks.append({"type": "gpt_block", "n_heads": 2})
    vis_out = 32 if fusion == "add" else 24
    regions = [
        {"name": "text", "input": {"kind": "tokens"},
         "layers": [{"type": "embedding", "vocab_size": 16, "out": 32}, {"type": "pos_embedding"}] + blocks,
         "mesh": {"pp": 2, "virtual_stages": text_v}, "schedule": {"name": text_sched}},
        {"name": "vision", "input": {"kind": "features", "dim": 8},
         "layers": [{"type": "linear", "out": 32}, {"type": "gelu"}, {"stage_boundary": {}},
                    {"type": "linear", "out": vis_out}],
         "mesh": {"pp": 2}, "schedule": {"name": vision_sched}},
        {"name": "head", "layers": [{"type": "linear", "out": 48}, {"type": "gelu"}, {"type": "linear", "out": 16},
                                    {"type": "cross_entropy"}],
         "schedule": {"name": head_sched}}]
    sched = {"microbatches": 4}
    if serial:
        sched["regions"] = "serial"
    return {"name": f"regions-{text_sched}-{vision_sched}",
            "model": {"seq_len": 8, "regions": regions,
                      "graph": [{"to": "head", "from": ["text", "vision"], "fusion": fusion}]},
            "mesh": {"pp": 2 if serial else 5}, "schedule": sched,
            "train": {"steps": steps, "batch_size": 8, "seed": 5, "grad_clip": 1.0,
                      "optimizer": {"name": "adamw", "lr": 3e-3, "warmup_steps": 2, "weight_decay": 0.1}},
            "data": {"kind": "shift", "keys": 3}}


class Suite:
    def __init__(self, build, src, tmp):
        self.build, self.src, self.tmp = build, src, tmp
        self.check, self.n = driver.Checks(), 0

    def equal_run(self, label, spec):
        self.n += 1
        d = os.path.join(self.tmp, f"{self.n}")
        os.makedirs(d)
        path = os.path.join(d, "job.json")
        json.dump(spec, open(path, "w"))
        p = subprocess.run([PY, os.path.join(HERE, "driver.py"), "--job", path, "--build", self.build,
                            "--src", self.src, "--out", os.path.join(d, "out")], capture_output=True, text=True,
                           timeout=600)
        res_path = os.path.join(d, "out", "result.json")
        res = json.load(open(res_path)) if os.path.exists(res_path) else None
        if not self.check(f"{label}: run completes", p.returncode == 0 and res is not None,
                          (p.stdout + p.stderr)[-600:]):
            return None
        self.reference(d, path)
        c = subprocess.run([PY, os.path.join(HERE, "compare_run.py"), res_path, os.path.join(d, "ref.jsonl"),
                            os.path.join(d, "ref.safetensors"), "1e-5", "0"], capture_output=True, text=True)
        self.check(f"{label}: equals the single-process run", c.returncode == 0, (c.stdout + c.stderr).strip())
        self.check(f"{label}: workers exit cleanly", res["exit_codes"] == [0] * len(res["exit_codes"]),
                   str(res["exit_codes"]))
        return res, json.load(open(os.path.join(d, "out", "plan.json")))

    def reference(self, d, path):
        """`pipewright train` of the job at path: d/ref.jsonl, d/ref.safetensors."""
        subprocess.run([os.path.join(self.build, "pipewright"), "train", "--job", path, "--quiet", "--log-json",
                        os.path.join(d, "ref.jsonl"), "--out", os.path.join(d, "ref.safetensors")],
                       check=True, cwd=self.src)

    def coordinator_run(self, spec):
        """The job through a coordinator and its workers, against `pipewright train`."""
        d = os.path.join(self.tmp, "coord")
        os.makedirs(d)
        json.dump(spec, open(os.path.join(d, "job.json"), "w"))
        self.reference(d, os.path.join(d, "job.json"))
        c = driver.Cluster(self.build, d, "rg")
        try:
            for i in range(5):
                c.start_worker(f"w{i}")
            self.check("coordinator: 5 workers idle", c.wait_idle(5))
            jid = c.submit(spec)
            job = c.wait_job(jid)
            if not self.check("coordinator: the job succeeds", job.get("state") == "succeeded", str(job)[-400:]):
                return
            _, rows = driver.http(c.base, f"/v1/jobs/{jid}/metrics?since=0")
            got = [r["loss"] for r in sorted(rows.get("metrics", []), key=lambda r: r["step"])]
            want = [json.loads(line)["loss"] for line in open(os.path.join(d, "ref.jsonl"))]
            self.check("coordinator: every step's loss equals the single-process run's",
                       len(got) == len(want) and all(abs(a - b) <= 1e-7 * abs(b) for a, b in zip(got, want)),
                       f"{got} vs {want}")
            blob = c.checkpoint(jid)
            mine = os.path.join(d, "cluster.safetensors")
            open(mine, "wb").write(blob if isinstance(blob, bytes) else b"")
            a, _ = st.load(mine)
            b, _ = st.load(os.path.join(d, "ref.safetensors"))
            same = sorted(a) == sorted(b) and all(a[k].tobytes() == b[k].tobytes() for k in b)
            self.check("coordinator: the downloaded checkpoint equals the single-process run's, bit for bit", same,
                       f"{len(a)} vs {len(b)} tensors")
            _, tl = driver.http(c.base, f"/v1/jobs/{jid}/timeline")
            want = [{"name": "text", "ranks": [0, 1]}, {"name": "vision", "ranks": [2, 3]}, {"name": "head", "ranks": [4]}]
            self.check("coordinator: the timeline's planned lanes name their regions",
                       isinstance(tl, dict) and (tl.get("planned") or {}).get("regions") == want, str(tl)[:300])
            self.check("coordinator: no worker crashed", not c.crashed(), str(c.crashed()))
        finally:
            c.stop()


def main():
    build, src = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    quick = "--quick" in sys.argv
    with tempfile.TemporaryDirectory(prefix="pw-regions-") as tmp:
        t = Suite(build, src, tmp)
        out = t.equal_run("text 1f1b + vision zb-h1 + head 1f1b", job("1f1b", "zb-h1"))
        if out:
            res, plan = out
            s2r = plan["stage_to_rank"]
            t.check("stages on disjoint ranks: text 0-1, vision 2-3, fusion + head 4", s2r == [0, 1, 2, 3, 4], str(s2r))
            ran = {r: sorted({a[2] for a in acts}) for r, acts in res["actions"].items()}
            t.check("each rank ran only its own stages", ran == {str(r): [r] for r in range(5)}, str(ran))
        t.equal_run("the same, serial regions on 2 ranks", job("1f1b", "zb-h1", serial=True))
        combos = [("gpipe", "1f1b", "zb-h1", 1), ("interleaved-1f1b", "gpipe", "1f1b", 2),
                  ("zb-h1", "interleaved-1f1b", "1f1b", 1)]
        if quick:
            combos = combos[1:2]
        for ts, vs, hs, tv in combos:
            spec = job(ts, vs if vs != "interleaved-1f1b" else "1f1b", hs, text_v=tv)
            if vs == "interleaved-1f1b":  # vision in 4 stages over 2 ranks
                spec["model"]["regions"][1]["layers"] = [
                    {"type": "linear", "out": 32}, {"stage_boundary": {}}, {"type": "gelu"}, {"stage_boundary": {}},
                    {"type": "linear", "out": 32}, {"stage_boundary": {}}, {"type": "linear", "out": 24}]
                spec["model"]["regions"][1]["mesh"]["virtual_stages"] = 2
                spec["model"]["regions"][1]["schedule"]["name"] = vs
            t.equal_run(f"text {ts} (V {tv}) + vision {vs} + head {hs}", spec)
        if not quick:
            t.equal_run("add fusion, 1f1b everywhere", job("1f1b", "1f1b", fusion="add"))
            spec = job("1f1b", "zb-h1")
            spec["mesh"]["dp"] = 2
            t.equal_run("two replicas of every region (pp 5 x dp 2)", spec)
        t.coordinator_run(job("1f1b", "zb-h1"))
        spec = job("interleaved-1f1b", "1f1b", "gpipe", text_v=2)
        path = os.path.join(tmp, "misfit.json")
        json.dump(spec, open(path, "w"))
        p = subprocess.run([os.path.join(build, "pipewright"), "plan", "--job", path], capture_output=True, text=True)
        t.check("schedules that cannot meet are refused at plan time", p.returncode == 1 and
                "model.regions: the regions' schedules do not fit together" in p.stderr and "deadlock" in p.stderr,
                p.stderr.strip()[-300:])
        print(f"test_regions_pipeline: {t.check.passed} passed, {t.check.failed} failed")
        return 1 if t.check.failed else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""test_placement: explicit partitions and mesh.placement on real
pipewright-worker processes (driver.py plays the coordinator), a small GPT,
4 steps each:

  - partition.stages listing exactly what mode even gives, and placements
    equal to the schedule's own layout (1f1b's [0, 1]; interleaved-1f1b's
    "loop" and [0, 1, 0, 1]), give the default run's losses, gradient norms
    and final parameters bit for bit;
  - relabeled placements ([1, 0] and [3, 2, 1, 0] with 1f1b,
    [1, 0, 1, 0] with interleaved-1f1b): the same bits too — the first
    stage (data in) and the last (loss) run on whichever rank the placement
    says, and the links follow stage_to_rank;
  - explicit partitions even cannot express (the embedding alone on stage
    0, at pp 2 and pp 4) train and equal the single-process run (1e-5);
  - `pipewright plan` shows the placement, and refuses a placement the
    schedule cannot run, naming the stage and why;
  - through a real coordinator: a relabeled placement with an explicit
    partition runs and its checkpoint is the driver's run's, bit for bit;
    POST /v1/jobs refuses a placement off the layout and an unknown layer
    name with 422, naming the JSON path.
Usage: test_placement.py BUILD_DIR SOURCE_DIR"""
import json, os, subprocess, sys, tempfile

import driver as d

HERE = os.path.dirname(os.path.abspath(__file__))
PY = "/usr/bin/python3"
sys.path.insert(0, os.path.join(HERE, "..", "ref"))
import numpy as np  # noqa: E402
import st  # noqa: E402


def job(name, pp, V=1, placement=None, stages=None, steps=4):
    j = {"name": "place",
         "model": {"template": "gpt", "vocab_size": 256, "seq_len": 8, "d_model": 16, "n_layers": 4, "n_heads": 2},
         "mesh": {"pp": pp, "virtual_stages": V},
         "schedule": {"name": name, "microbatches": 4},
         "train": {"steps": steps, "batch_size": 8, "seed": 5, "grad_clip": 0.5,
                   "optimizer": {"name": "adamw", "lr": 3e-3, "warmup_steps": 1, "weight_decay": 0.1}},
         "data": {"kind": "text", "path": "examples/data/corpus.txt", "sampler": "sequential"}}
    if placement is not None:
        j["mesh"]["placement"] = placement
    if stages is not None:
        j["partition"] = {"stages": stages}
    return j


class Suite:
    def __init__(self, build, src, tmp):
        self.build, self.src, self.tmp = build, src, tmp
        self.passed = self.failed = 0
        self.runs = {}

    def check(self, label, ok, detail=""):
        print(f"{'ok  ' if ok else 'FAIL'} {label}{(': ' + str(detail)) if detail else ''}", flush=True)
        self.passed += ok
        self.failed += not ok
        return ok

    def run(self, label, spec):
        d = os.path.join(self.tmp, label)
        os.makedirs(d)
        path = os.path.join(d, "in.json")
        json.dump(spec, open(path, "w"))
        p = subprocess.run([PY, os.path.join(HERE, "driver.py"), "--job", path, "--build", self.build, "--src",
                            self.src, "--out", os.path.join(d, "out"), "--trace-every", "0", "--timeout", "120"],
                           capture_output=True, text=True, timeout=300)
        rp = os.path.join(d, "out", "result.json")
        res = json.load(open(rp)) if os.path.exists(rp) else None
        ok = p.returncode == 0 and res is not None and len(res["done"]) == len(res["exit_codes"]) and res.get("merged")
        if not self.check(f"{label}: run completes", bool(ok), (p.stdout + p.stderr)[-600:]):
            return None
        self.check(f"{label}: workers exit cleanly", res["exit_codes"] == [0] * len(res["exit_codes"]),
                   str(res["exit_codes"]))
        res["dir"] = d
        self.runs[label] = res
        return res

    def same_bits(self, label, base):
        a, b = self.runs.get(label), self.runs.get(base)
        if not a or not b:
            return self.check(f"{label} = {base} bit for bit", False, "a run is missing")
        why = []
        if a["losses"] != b["losses"] or len(a["losses"]) != 4:
            why.append(f"losses {a['losses']} vs {b['losses']}")
        if a["grad_norms"] != b["grad_norms"]:
            why.append(f"grad norms {a['grad_norms']} vs {b['grad_norms']}")
        ta, _ = st.load(a["merged"])
        tb, _ = st.load(b["merged"])
        if set(ta) != set(tb):
            why.append("tensor names differ")
        for k in sorted(set(ta) & set(tb)):
            x, y = np.asarray(ta[k]), np.asarray(tb[k])
            if x.shape != y.shape or x.tobytes() != y.tobytes():
                why.append(f"{k} differs")
        return self.check(f"{label} = {base} bit for bit ({len(tb)} tensors, 4 losses)", not why, "; ".join(why[:5]))

    def equals_single(self, label, spec):
        res = self.runs.get(label)
        if not res:
            return self.check(f"{label}: equals the single-process run", False, "no run")
        d = os.path.join(self.tmp, label + "-ref")
        os.makedirs(d)
        path = os.path.join(d, "job.json")
        json.dump(spec, open(path, "w"))
        subprocess.run([os.path.join(self.build, "pipewright"), "train", "--job", path, "--quiet", "--log-json",
                        os.path.join(d, "ref.jsonl"), "--out", os.path.join(d, "ref.safetensors")],
                       check=True, cwd=self.src)
        c = subprocess.run([PY, os.path.join(HERE, "compare_run.py"), os.path.join(res["dir"], "out", "result.json"),
                            os.path.join(d, "ref.jsonl"), os.path.join(d, "ref.safetensors"), "1e-5"],
                           capture_output=True, text=True)
        return self.check(f"{label}: equals the single-process run", c.returncode == 0, (c.stdout + c.stderr).strip())

    def plan(self, spec):
        d = tempfile.mkdtemp(dir=self.tmp)
        path = os.path.join(d, "job.json")
        json.dump(spec, open(path, "w"))
        p = subprocess.run([os.path.join(self.build, "pipewright"), "plan", "--job", path], capture_output=True,
                           text=True, cwd=self.src)
        return p.returncode, p.stdout + p.stderr


def coordinator(t, tmp):
    """The same placements through pipewright-coordinator and its API."""
    ctmp = os.path.join(tmp, "cluster")  # its logs, printed by close_cluster when a check failed
    os.makedirs(ctmp)
    c = d.Cluster(t.build, ctmp, "coord", data_root=t.src)
    try:
        for w in ("w0", "w1"):
            c.start_worker(w)
        t.check("coordinator: two idle workers", c.wait_idle(2), c.worker_rows())
        spec = job("1f1b", 2, placement=[1, 0],
                   stages=[["embed"], ["blocks.0", "blocks.1", "blocks.2", "blocks.3", "head"]])
        spec["data"]["path"] = os.path.join(t.src, spec["data"]["path"])
        jid = c.submit(spec)
        j = c.wait_job(jid, timeout=120)
        if t.check("coordinator: the placed job succeeds", j.get("state") == "succeeded", str(j)[:400]):
            base = t.runs.get("embed-alone-pp2")
            diff = d.bit_diff(c.checkpoint(jid), open(base["merged"], "rb").read()) if base else "no driver run"
            t.check("coordinator: its checkpoint is the driver's unplaced run's, bit for bit", diff == "", diff)
        bad = job("interleaved-1f1b", 2, V=2, placement=[0, 1, 1, 0])
        st_, r = d.http(c.base, "/v1/jobs", "POST", bad)
        t.check("coordinator: a placement off the layout is a 422 naming mesh.placement[2]",
                st_ == 422 and "mesh.placement[2]" in json.dumps(r) and "runs stages 0 and 2 on one rank" in json.dumps(r),
                f"{st_} {r}")
        bad = job("1f1b", 2, stages=[["embed", "blocks.0", "blocks.1"], ["blocks.2", "blocks.3", "haed"]])
        st_, r = d.http(c.base, "/v1/jobs", "POST", bad)
        t.check("coordinator: an unknown layer is a 422 naming partition.stages[1][2] and the nearest name",
                st_ == 422 and "partition.stages[1][2]" in json.dumps(r) and "did you mean head" in json.dumps(r),
                f"{st_} {r}")
    finally:
        d.close_cluster(c, ctmp, t.check, lambda: t.failed)


def main():
    build, src = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    with tempfile.TemporaryDirectory(prefix="pw-place-") as tmp:
        t = Suite(build, src, tmp)
        even2 = [["embed", "blocks.0", "blocks.1"], ["blocks.2", "blocks.3", "head"]]
        t.run("1f1b-pp2", job("1f1b", 2))
        t.run("1f1b-pp2-explicit-even", job("1f1b", 2, stages=even2))
        t.same_bits("1f1b-pp2-explicit-even", "1f1b-pp2")
        t.run("1f1b-pp2-reversed", job("1f1b", 2, placement=[1, 0]))
        t.same_bits("1f1b-pp2-reversed", "1f1b-pp2")
        t.run("1f1b-pp4", job("1f1b", 4))
        t.run("1f1b-pp4-reversed", job("1f1b", 4, placement=[3, 2, 1, 0]))
        t.same_bits("1f1b-pp4-reversed", "1f1b-pp4")
        res = t.runs.get("1f1b-pp4-reversed")
        if res:  # the loss came from the rank that runs the last stage: rank 0
            plan = json.load(open(os.path.join(res["dir"], "out", "plan.json")))
            t.check("pp4 reversed: the plan puts stage 0 on rank 3 and the loss stage on rank 0",
                    plan["stage_to_rank"] == [3, 2, 1, 0], str(plan["stage_to_rank"]))

        t.run("interleaved-pp2", job("interleaved-1f1b", 2, V=2))
        t.run("interleaved-pp2-loop", job("interleaved-1f1b", 2, V=2, placement="loop"))
        t.same_bits("interleaved-pp2-loop", "interleaved-pp2")
        t.run("interleaved-pp2-array", job("interleaved-1f1b", 2, V=2, placement=[0, 1, 0, 1]))
        t.same_bits("interleaved-pp2-array", "interleaved-pp2")
        t.run("interleaved-pp2-relabeled", job("interleaved-1f1b", 2, V=2, placement=[1, 0, 1, 0]))
        t.same_bits("interleaved-pp2-relabeled", "interleaved-pp2")

        # What even cannot express: the embedding alone on stage 0.
        spec = job("1f1b", 2, stages=[["embed"], ["blocks.0", "blocks.1", "blocks.2", "blocks.3", "head"]])
        t.run("embed-alone-pp2", spec)
        t.equals_single("embed-alone-pp2", spec)
        spec = job("1f1b", 4, placement=[0, 3, 2, 1],
                   stages=[["embed"], ["blocks.0", "blocks.1"], ["blocks.2"], ["blocks.3", "head"]])
        t.run("embed-alone-pp4-relabeled", spec)
        t.equals_single("embed-alone-pp4-relabeled", spec)

        # pipewright plan: shows the placement; refuses what the schedule cannot run.
        rc, out = t.plan(job("interleaved-1f1b", 2, V=2, placement=[1, 0, 1, 0]))
        t.check("plan shows the placement", rc == 0 and "placement: stage -> rank 1 0 1 0 (mesh.placement)" in out,
                out[:400])
        rc, out = t.plan(job("interleaved-1f1b", 2, V=2, placement=[0, 1, 1, 0]))
        t.check("plan refuses a placement off the layout, naming the stage",
                rc != 0 and "mesh.placement[2]: interleaved-1f1b runs stages 0 and 2 on one rank; this placement puts "
                "them on ranks 0 and 1" in out and "use a placement of the loop layout or a custom schedule" in out,
                out[-400:])
        rc, out = t.plan(job("1f1b", 2, stages=[["embed", "blocks.0"], ["blocks.3", "head"]]))
        t.check("plan names layers in no stage",
                rc != 0 and 'partition.stages[1][0]: layers "blocks.1".."blocks.2" are in no stage' in out, out[-300:])
        coordinator(t, tmp)
        print(f"{t.passed} passed, {t.failed} failed")
        return 1 if t.failed else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""test_eval_loss: train.eval_every on a real coordinator and 4 workers,
small GPTs on the text corpus (its held-out tail is the eval split), 10
steps, checkpoint_every = eval_every = 5, eval_batches 2:

  - pp=2 1f1b, pp=2 interleaved-1f1b (V=2) and pp=2 x dp=2 1f1b: the
    metrics rows of steps 5 and 10 carry an eval_loss equal to `pipewright
    eval --job F --checkpoint <that step's checkpoint>` (which prints 6
    decimals: equal to 5e-7 plus 1e-6 relative for the dp=2 sum of
    replica shares), every other row has null; the job object carries
    the latest (step 10's); /metrics has pipewright_job_eval_loss;
  - the forward-only eval passes change nothing: each job's final
    checkpoint equals the same job with eval_every 0, bit for bit.
Usage: test_eval_loss.py BUILD_DIR SOURCE_DIR"""
import json, os, re, subprocess, sys, tempfile

import driver as d

BUILD, SRC = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
check = d.Checks()


def spec(name, sched="1f1b", V=1, dp=1, every=5):
    return {"name": name,
            "model": {"template": "gpt", "vocab_size": 256, "seq_len": 16, "d_model": 16, "n_layers": 4, "n_heads": 2},
            "mesh": {"pp": 2, "dp": dp, "virtual_stages": V}, "schedule": {"name": sched, "microbatches": 2},
            "train": {"steps": 10, "batch_size": 8, "seed": 3, "checkpoint_every": 5, "eval_every": every,
                      "eval_batches": 2, "optimizer": {"name": "adamw", "lr": 3e-3}},
            "data": {"kind": "text", "path": os.path.join(SRC, "examples/data/corpus.txt"), "sampler": "sequential"}}


def cli_eval(tmp, sp, blob, tag):
    jf, ck = os.path.join(tmp, tag + ".json"), os.path.join(tmp, tag + ".safetensors")
    json.dump(sp, open(jf, "w"))
    open(ck, "wb").write(blob)
    r = subprocess.run([os.path.join(BUILD, "pipewright"), "eval", "--job", jf, "--checkpoint", ck],
                       capture_output=True, text=True, env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
    m = re.search(r"eval loss ([0-9.]+)", r.stdout)
    return float(m.group(1)) if m else r.stdout + r.stderr


def main():
    tmp = tempfile.mkdtemp(prefix="pw-eval-")
    c = d.Cluster(BUILD, tmp, "ev", data_root=SRC)
    for i in range(4):
        c.start_worker(f"w{i}")
    check("4 workers idle", c.wait_idle(4))
    cases = [("pp2", spec("pp2")), ("interleaved", spec("il", "interleaved-1f1b", V=2)), ("dp2", spec("dp2", dp=2))]
    # each with its eval_every 0 twin, run at the same time when they fit
    for tag, sp in cases:
        off = dict(sp, name=sp["name"] + "-off", train=dict(sp["train"], eval_every=0))
        jid = c.submit(sp)
        if sp["mesh"]["dp"] == 1:
            jid_off = c.submit(off)
        job = c.wait_job(jid)
        check(f"{tag}: the job succeeds", job.get("state") == "succeeded", job)
        if sp["mesh"]["dp"] > 1:
            jid_off = c.submit(off)
        job_off = c.wait_job(jid_off)
        check(f"{tag}: its eval_every 0 twin succeeds", job_off.get("state") == "succeeded", job_off)
        rows = {r["step"]: r for r in d.all_metrics(c, jid)}
        check(f"{tag}: 10 metrics rows", sorted(rows) == list(range(10)), sorted(rows))
        check(f"{tag}: rows of steps not evaluated have a null eval_loss",
              all("eval_loss" in rows[k] and rows[k]["eval_loss"] is None for k in rows if k not in (4, 9)),
              {k: rows[k].get("eval_loss", "absent") for k in rows})
        for k in (4, 9):
            got = rows.get(k, {}).get("eval_loss")
            st_, blob = d.http(c.base, f"/v1/jobs/{jid}/checkpoint?step={k + 1}", raw=True)
            ref = cli_eval(tmp, sp, blob, f"{tag}-{k + 1}") if st_ == 200 else f"{st_}: {blob}"
            tol = 5e-7 + (1e-6 * abs(ref) if sp["mesh"]["dp"] > 1 and isinstance(ref, float) else 0)
            ok = isinstance(got, float) and isinstance(ref, float) and abs(got - ref) <= tol
            check(f"{tag}: step {k + 1}'s eval_loss is `pipewright eval` on its checkpoint", ok, (got, ref))
        check(f"{tag}: the job carries the latest eval_loss (step 10's)",
              job.get("eval_loss") is not None and job.get("eval_loss") == rows.get(9, {}).get("eval_loss"),
              (job.get("eval_loss"), rows.get(9, {}).get("eval_loss")))
        check(f"{tag}: the job without eval has no eval_loss", job_off.get("eval_loss") is None, job_off.get("eval_loss"))
        diff = d.bit_diff(c.checkpoint(jid), c.checkpoint(jid_off))
        check(f"{tag}: evaluating changes no weight (final checkpoint bit for bit)", diff == "", diff)
    st_, text = d.http(c.base, "/metrics")
    check("/metrics declares pipewright_job_eval_loss", st_ == 200 and "# TYPE pipewright_job_eval_loss gauge" in str(text),
          str(text)[:300])
    d.close_cluster(c, tmp, check, lambda: check.failed > 0)
    print(f"{check.passed} passed, {check.failed} failed")
    return 1 if check.failed else 0


if __name__ == "__main__":
    sys.exit(main())

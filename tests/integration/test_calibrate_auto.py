#!/usr/bin/env python3
"""test_calibrate_auto: "schedule": {"name": "auto"} at POST /v1/jobs, through
a real coordinator and two one-thread workers.

  - the FLOP model (no profile): the job is stored and run with the
    configuration `pipewright plan --auto --max-pp 2` chooses (pp up to the
    two connected workers): the job JSON's pp, schedule, virtual stages and
    microbatches are that row's, one "auto" event names them, the cost
    model and the predicted step, and the job succeeds;
  - with schedule.profile (a `pipewright calibrate` profile): the choice of
    `plan --auto --profile F --max-pp 2`, the event says "calibrated
    profile";
  - a broken profile is refused (422) naming schedule.profile and the
    profile's own field; a regions model is refused naming model.regions;
    nothing is queued for either.
Usage: test_calibrate_auto.py BUILD_DIR SOURCE_DIR"""
import json, os, subprocess, sys, tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import driver as d  # noqa: E402

BUILD, SRC = sys.argv[1], sys.argv[2]
PW = os.path.join(BUILD, "pipewright")
FAILS = []


def check(what, cond, detail=""):
    print(("ok   " if cond else "FAIL ") + what + (f": {detail}" if detail and not cond else ""), flush=True)
    if not cond:
        FAILS.append(what)
    return cond


def spec(name="auto"):
    return {"name": name,
            "model": {"template": "gpt", "vocab_size": 256, "seq_len": 16, "d_model": 32, "n_layers": 4, "n_heads": 2},
            "mesh": {"pp": 1}, "schedule": {"name": "auto"},
            "train": {"steps": 2, "batch_size": 8, "seed": 5, "optimizer": {"name": "adamw", "lr": 3e-3}},
            "data": {"kind": "text", "path": os.path.join(SRC, "examples/data/corpus.txt"), "sampler": "sequential"}}


def cli_choice(tmp, profile=None):
    """`plan --auto --max-pp 2` on the same spec (schedule named: the CLI reads a plain spec)."""
    j = spec()
    j["schedule"] = {"name": "1f1b"}
    path = os.path.join(tmp, "cli.json")
    json.dump(j, open(path, "w"))
    args = [PW, "plan", "--job", path, "--auto", "--max-pp", "2", "--json"] + (["--profile", profile] if profile else [])
    return json.loads(subprocess.run(args, check=True, capture_output=True, text=True).stdout)["chosen"]


def same(job, ch):
    m = job.get("mesh") or {}
    return (m.get("pp"), job.get("schedule"), m.get("virtual_stages"), job.get("microbatches")) == \
        (ch["pp"], ch["schedule"], ch["virtual_stages"], ch["microbatches"])


def run_auto(c, tmp, body, profile, label):
    want = cli_choice(tmp, profile)
    jid = c.submit(body)
    job = c.wait_job(jid)
    check(f"{label}: the job runs with plan --auto's choice "
          f"(pp {want['pp']} {want['schedule']} V {want['virtual_stages']} m {want['microbatches']})",
          same(job, want), (job.get("mesh"), job.get("schedule"), job.get("microbatches"), want))
    check(f"{label}: the job succeeds", job.get("state") == "succeeded", job.get("error"))
    evs = [e for e in c.events(jid) if e.get("kind") == "auto"]
    msg = evs[0].get("message", "") if evs else ""
    model = "calibrated profile" if profile else "FLOP model"
    check(f"{label}: one auto event naming the cost model, the choice and the predicted step",
          len(evs) == 1 and msg.startswith(f"schedule auto ({model}; pp up to 2: 2 connected workers, dp 1): "
                                           f"pp {want['pp']}, {want['schedule']}, virtual stages "
                                           f"{want['virtual_stages']}, {want['microbatches']} microbatches") and
          f"predicted {want['predicted'] * 1e3:.3f} ms/step" in msg, evs)


def n_jobs(c):
    st, r = d.http(c.base, "/v1/jobs?limit=500")
    return len(r.get("jobs", [])) if st == 200 and isinstance(r, dict) else -1


def refused(c, body, path, words, label):
    n = n_jobs(c)
    st, r = d.http(c.base, "/v1/jobs", "POST", body)
    text = json.dumps(r)
    check(f"{label}: 422 naming {path}", st == 422 and path in text and words in text, (st, r))
    check(f"{label}: nothing queued", n >= 0 and n_jobs(c) == n)


def main():
    tmp = tempfile.mkdtemp(prefix="pw-auto-")
    c = d.Cluster(BUILD, tmp, "auto", data_root=SRC)
    try:
        for i in range(2):
            c.start_worker(f"w{i}")
        check("2 workers idle", c.wait_idle(2))
        run_auto(c, tmp, spec(), None, "FLOP model")

        prof = os.path.join(tmp, "prof.json")
        j = spec()
        j["schedule"] = {"name": "1f1b"}
        json.dump(j, open(os.path.join(tmp, "cal.json"), "w"))
        subprocess.run([PW, "calibrate", "--job", os.path.join(tmp, "cal.json"), "--mb", "1,2,4,8", "--target-ms", "1",
                        "--share-ms", "20", "--out", prof], check=True, env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
        body = spec("auto-profile")
        body["schedule"]["profile"] = json.load(open(prof))
        run_auto(c, tmp, body, prof, "calibrated profile")

        body = spec("bad-profile")
        body["schedule"]["profile"] = {"version": 9}
        refused(c, body, "schedule.profile", "profile.version", "a broken profile")
        body = spec("regions")
        body["model"] = json.load(open(os.path.join(SRC, "examples/jobs/two-tower.json")))["model"]
        body["data"] = {"kind": "shift", "keys": 4}
        body["mesh"] = {"pp": 5}
        refused(c, body, "model.regions", "--auto", "a regions model")
    finally:
        d.close_cluster(c, tmp, lambda *a: check(*a[:2]), lambda: bool(FAILS))
    print(f"{'FAIL' if FAILS else 'PASS'} test_calibrate_auto ({len(FAILS)} failed)")
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())

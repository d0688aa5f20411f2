#!/usr/bin/env python3
"""test_custom_schedule: custom schedules end to end — a real coordinator
and four real workers on loopback.

  1. Each of the nine built-in schedules (pp 2, the V it needs, m 4) is
     exported (`pipewright plan --export`) and submitted as the spec's
     schedule.custom next to the built-in one: both succeed, the stored
     spec keeps the lists, and the two final checkpoints are the same bytes;
     so does 1f1b with its two lists swapped (stage 0 then lives on rank 1).
  2. `--export --format csv` then `--import-csv`: the same lists and the
     same plan text (the grid, the analytics) as the built-in.
  3. Broken custom schedules are refused at submit (POST /v1/jobs and POST
     /v1/plans: 422 with path schedule.custom.ranks): a deadlock names the
     ranks and the actions they wait at; a missing action, a doubled one and
     an action on another rank's stage are named.
  4. GET /v1/schedules lists each schedule's aliases.
Usage: test_custom_schedule.py BUILD_DIR SOURCE_DIR"""
import json, os, subprocess, sys, tempfile

BUILD, SRC = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import driver as d  # noqa: E402  (Cluster, http, wait_for, bit_diff, close_cluster)

check = d.Checks()
PW = os.path.join(BUILD, "pipewright")
NAMES = ["gpipe", "1f1b", "eager1f1b", "zb-h1", "interleaved-1f1b", "interleaved-gpipe",
         "interleaved-1f1b-plus-one", "kimi-k2", "dualpipev"]


def spec(name, V, custom=None):
    s = {"name": f"cs-{name}{'-custom' if custom else ''}",
         "model": {"template": "gpt", "vocab_size": 32, "seq_len": 8, "d_model": 16, "n_layers": 4, "n_heads": 2},
         "mesh": {"pp": 2, "dp": 1, "virtual_stages": V},
         "schedule": {"name": name, "microbatches": 4},
         "train": {"steps": 2, "batch_size": 8, "seed": 5,
                   "optimizer": {"name": "adamw", "lr": 3e-3, "weight_decay": 0.1}},
         "data": {"kind": "copy"}}
    if custom is not None:
        s["schedule"] = {"microbatches": 4, "custom": custom}
    return s


def plan(tmp, sp, *args):
    f = os.path.join(tmp, "job.json")
    json.dump(sp, open(f, "w"))
    p = subprocess.run([PW, "plan", "--job", f, *args], capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout, p.stderr


def refused(c, path, sp, want):
    st, r = d.http(c.base, path, "POST", sp)
    e = r.get("error", {}) if isinstance(r, dict) else {}
    msg = e.get("message", "")
    return st == 422 and e.get("path") == "schedule.custom.ranks" and all(w in msg for w in want), (st, r)


def main():
    tmp = tempfile.mkdtemp(prefix="pw-custom-")
    c = d.Cluster(BUILD, tmp, "cs")
    try:
        for i in range(4):
            c.start_worker(f"w{i}")
        # exports first (the CLI), while the workers register
        todo = []
        for name in NAMES:
            V = 2 if name.startswith("interleaved") or name in ("kimi-k2", "dualpipev") else 1
            rc, out, err = plan(tmp, spec(name, V), "--export")
            if not check(f"{name}: --export", rc == 0, err):
                continue
            custom = json.loads(out)
            # 2. the CSV path gives the same lists and the same plan
            rc, csv, err = plan(tmp, spec(name, V), "--export", "--format", "csv")
            cf = os.path.join(tmp, f"{name}.csv")
            open(cf, "w").write(csv)
            rc2, back, err2 = plan(tmp, spec("1f1b", 1), "--import-csv", cf, "--export")
            check(f"{name}: export csv, import-csv: the same lists", rc == 0 and rc2 == 0 and json.loads(back) == custom,
                  (err, err2, csv[:200]))
            _, text_builtin, _ = plan(tmp, spec(name, V))
            _, text_csv, _ = plan(tmp, spec("1f1b", 1), "--import-csv", cf)
            # all but the title and the placement line's source (the layout of NAME / the custom lists)
            same = lambda t: [ln.split(" (")[0] if ln.startswith("placement:") else ln for ln in t.split("\n")[1:]]
            check(f"{name}: import-csv plans as the built-in (grid, analytics)",
                  same(text_builtin) == same(text_csv) and "schedule custom" in text_csv,
                  text_csv[:300])
            todo.append((name, V, custom))
        check("four idle workers", c.wait_idle(4, 30), c.worker_rows())
        jobs = [(name, c.submit(spec(name, V)), c.submit(spec(name, V, custom)), custom) for name, V, custom in todo]
        # stage -> rank comes from the lists: 1f1b's two lists swapped put
        # stage 0 on rank 1 and stage 1 on rank 0, and train the same bits
        one = next((cu for n, _, cu in todo if n == "1f1b"), None)
        swapped = {"ranks": list(reversed(one["ranks"]))} if one else None
        if swapped:
            rc, out, err = plan(tmp, spec("1f1b", 1, swapped), "--json")
            check("1f1b's lists swapped: stage 0 on rank 1, stage 1 on rank 0",
                  rc == 0 and json.loads(out)["stage_to_rank"] == [1, 0], (rc, err))
            builtin = next(jb for n, jb, _, _ in jobs if n == "1f1b")
            jobs.append(("1f1b (lists swapped)", builtin, c.submit(spec("1f1b", 1, swapped)), swapped))
        # 1. every pair trains to the same bytes
        for name, jb, jc, custom in jobs:
            eb, ec = c.wait_job(jb, timeout=300), c.wait_job(jc, timeout=300)
            check(f"{name}: built-in and custom jobs succeed", eb.get("state") == "succeeded" and
                  ec.get("state") == "succeeded", (eb.get("error"), ec.get("error")))
            check(f"{name}: the custom job is listed as schedule custom", ec.get("schedule") == "custom", ec.get("schedule"))
            sp = ec.get("spec") or {}
            check(f"{name}: the stored spec keeps the lists", sp.get("schedule", {}).get("custom") == custom,
                  sp.get("schedule"))
            diff = d.bit_diff(c.checkpoint(jc), c.checkpoint(jb))
            check(f"{name}: custom and built-in final parameters are the same bytes", not diff, diff)
        # 3. refused at submit, with what is wrong
        base = spec("x", 1, {"ranks": ["F0@s0 B0@s0 F1@s0 B1@s0 F2@s0 B2@s0 F3@s0 B3@s0",
                                       "F0@s1 F1@s1 B0@s1 B1@s1 F2@s1 B2@s1 F3@s1 B3@s1"]})
        want = ["deadlock: rank 0 waits at B0@s0 for B0@s1 (rank 1) which comes after F1@s1",
                "rank 1 waits at F1@s1 for F1@s0 (rank 0) which comes after B0@s0"]
        for path in ("/v1/jobs", "/v1/plans"):
            ok, got = refused(c, path, base, want)
            check(f"POST {path}: a deadlocking custom schedule is a 422 naming the waiting ranks and actions", ok, got)
        miss = json.loads(json.dumps(base))
        miss["schedule"]["custom"]["ranks"] = ["F0@s0 F1@s0 F2@s0 F3@s0 B0@s0 B1@s0 B2@s0",
                                               "F0@s1 B0@s1 F1@s1 B1@s1 F2@s1 B2@s1 F3@s1 B3@s1"]
        ok, got = refused(c, "/v1/jobs", miss, ["B3@s0 (or I3@s0 and W3@s0) is missing", "rank 0"])
        check("POST /v1/jobs: a missing action is named", ok, got)
        dup = json.loads(json.dumps(miss))
        dup["schedule"]["custom"]["ranks"][0] += " B3@s0 B3@s0"
        ok, got = refused(c, "/v1/jobs", dup, ["B3@s0 appears twice"])
        check("POST /v1/jobs: a doubled action is named", ok, got)
        other = json.loads(json.dumps(miss))
        other["schedule"]["custom"]["ranks"][1] += " B3@s0"
        ok, got = refused(c, "/v1/jobs", other, ["rank 1 #8: B3@s0 is on stage 0, which belongs to rank 0"])
        check("POST /v1/jobs: an action on another rank's stage is named", ok, got)
        # 4. the aliases
        st, r = d.http(c.base, "/v1/schedules")
        al = {s["name"]: s.get("aliases") for s in r.get("schedules", [])} if st == 200 else {}
        check("GET /v1/schedules lists aliases", "Std1F1B" in (al.get("1f1b") or []) and
              "LoopedBFS" in (al.get("interleaved-gpipe") or []) and all(isinstance(v, list) for v in al.values()), al)
    finally:
        d.close_cluster(c, tmp, check, lambda: check.failed > 0)
    print(f"{check.passed} passed, {check.failed} failed")
    return 1 if check.failed else 0


if __name__ == "__main__":
    sys.exit(main())

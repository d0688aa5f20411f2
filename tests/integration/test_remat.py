#!/usr/bin/env python3
"""test_remat: activation recomputation (partition.remat) across real
pipewright-worker processes on 127.0.0.1, driven by driver.py.

  - every schedule (the nine; pp 2, 4 microbatches, V = 2 for the
    interleaved ones and DualPipeV) with remat "full" equals the same run
    without remat bit for bit: every per-step loss the workers report and
    every final parameter;
  - a per-stage list (some stages recompute, some do not) on zb-h1, whose
    I's run ahead of their W's, and on interleaved-1f1b: the same bits too;
  - the plan of a remat run marks its stages and puts less memory on its
    ranks than the plain plan (never more).
Usage: test_remat.py BUILD_DIR SOURCE_DIR"""
import json, os, subprocess, sys, tempfile
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "ref"))
import st  # noqa: E402  (tests/ref/st.py)

PY = "/usr/bin/python3"
FLAT = ["gpipe", "1f1b", "eager1f1b", "zb-h1"]
VIRTUAL = ["interleaved-1f1b", "interleaved-gpipe", "interleaved-1f1b-plus-one", "kimi-k2", "dualpipev"]
LISTS = {"zb-h1": [True, False], "interleaved-1f1b": ["none", "full", True, False]}


def job(name, remat):
    V = 2 if name in VIRTUAL else 1
    part = {"mode": "even"}
    if remat is not None:
        part["remat"] = remat
    return {"name": f"remat-{name}",
            "model": {"template": "gpt", "vocab_size": 256, "seq_len": 16, "d_model": 32, "n_layers": 4,
                      "n_heads": 2, "tie_embeddings": False},
            "mesh": {"pp": 2, "dp": 1, "virtual_stages": V},
            "schedule": {"name": name, "microbatches": 4},
            "partition": part,
            "train": {"steps": 3, "batch_size": 8, "seed": 3, "grad_clip": 1.0,
                      "optimizer": {"name": "adamw", "lr": 3e-3, "warmup_steps": 1, "weight_decay": 0.1}},
            "data": {"kind": "text", "path": "examples/data/corpus.txt", "sampler": "sequential"}}


def drive(build, src, tmp, label, spec):
    d = os.path.join(tmp, label)
    os.makedirs(d)
    path = os.path.join(d, "in.json")
    json.dump(spec, open(path, "w"))
    p = subprocess.run([PY, os.path.join(HERE, "driver.py"), "--job", path, "--build", build, "--src", src,
                        "--out", os.path.join(d, "out"), "--trace-every", "0"],
                       capture_output=True, text=True, timeout=300)
    res_path = os.path.join(d, "out", "result.json")
    res = json.load(open(res_path)) if os.path.exists(res_path) else None
    plan = json.load(open(os.path.join(d, "out", "plan.json"))) if os.path.exists(os.path.join(d, "out", "plan.json")) else None
    ok = p.returncode == 0 and res is not None and "merged" in res
    return label, ok, res, plan, (p.stdout + p.stderr)[-800:]


def same_bits(a, b):
    """Losses equal as reported, every tensor equal byte for byte."""
    if a["losses"] != b["losses"] or len(a["losses"]) != 3:
        return f"losses {a['losses']} vs {b['losses']}"
    ta, tb = st.load(a["merged"])[0], st.load(b["merged"])[0]
    if set(ta) != set(tb):
        return "tensor names differ"
    diff = [n for n in sorted(ta) if ta[n].tobytes() != tb[n].tobytes()]
    return f"{len(diff)} tensors differ: {diff[:5]}" if diff else ""


def main():
    build, src = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    passed = failed = 0

    def check(label, ok, detail=""):
        nonlocal passed, failed
        print(f"{'ok  ' if ok else 'FAIL'} {label}{(': ' + detail) if detail else ''}", flush=True)
        passed, failed = passed + bool(ok), failed + (not ok)

    cases = [(f"{n}-none", job(n, None)) for n in FLAT + VIRTUAL]
    cases += [(f"{n}-full", job(n, "full")) for n in FLAT + VIRTUAL]
    cases += [(f"{n}-list", job(n, lst)) for n, lst in LISTS.items()]
    with tempfile.TemporaryDirectory(prefix="pw-remat-") as tmp:
        with ThreadPoolExecutor(max_workers=2) as ex:
            runs = {r[0]: r for r in ex.map(lambda c: drive(build, src, tmp, *c), cases)}
        for label, ok, _, _, out in runs.values():
            if not ok:
                check(f"{label}: run completes", False, out)
        for n in FLAT + VIRTUAL:
            base = runs[f"{n}-none"]
            for kind in ("full", "list") if n in LISTS else ("full",):
                r = runs[f"{n}-{kind}"]
                if not (base[1] and r[1]):
                    continue
                why = same_bits(r[2], base[2])
                check(f"{n} remat {kind}: same losses and parameters as without remat, bit for bit", not why, why)
                logs = "".join(open(os.path.join(tmp, r[0], "out", f"w{i}.log")).read() for i in range(2))
                n_re = logs.count(" recomputes: slots of ")
                n_want = len(r[3]["partition"]["stages"]) if kind == "full" else \
                    sum(v is True or v == "full" for v in LISTS[n])
                check(f"{n} remat {kind}: the workers recompute the stages the plan marks", n_re == n_want,
                      f"{n_re} stages say so, want {n_want}")
                stages = r[3]["partition"]["stages"]
                want = [True] * len(stages) if kind == "full" else \
                    [v is True or v == "full" for v in LISTS[n]]
                check(f"{n} remat {kind}: the plan marks its stages", [s["remat"] for s in stages] == want,
                      str([s["remat"] for s in stages]))
                mem = [x["memory_bytes"] for x in r[3]["analytics"]["ranks"]]
                mem0 = [x["memory_bytes"] for x in base[3]["analytics"]["ranks"]]
                check(f"{n} remat {kind}: planned memory per rank not above the plain plan's, below in sum",
                      all(a <= b for a, b in zip(mem, mem0)) and sum(mem) < sum(mem0), f"{mem} vs {mem0}")
        # `pipewright plan` says which stages recompute and what it saves
        path = os.path.join(tmp, "plan-list.json")
        spec = job("1f1b", [True, False])
        spec["data"]["path"] = os.path.join(src, spec["data"]["path"])
        json.dump(spec, open(path, "w"))
        out = subprocess.run([os.path.join(build, "pipewright"), "plan", "--job", path], capture_output=True,
                             text=True).stdout
        rows = [ln.split() for ln in out.splitlines() if ln[:1].isdigit() and len(ln.split()) == 11]
        ok = "remat" in out.splitlines()[2].split() and [r[-1] for r in rows] == ["yes", "no"]
        check("plan: the stage table's remat column", ok, "" if ok else out[:600])
        ok = any(ln.startswith("remat on rank 0: ") and "saved" in ln for ln in out.splitlines()) and \
            "remat on rank 1" not in out
        check("plan: the remat rank's line", ok, "" if ok else out)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed or not passed else 0


if __name__ == "__main__":
    sys.exit(main())

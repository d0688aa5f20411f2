#!/usr/bin/env python3
"""test_attention: the tiled attention (train.attention "tiled",
common/compute/ops_flash.c) across real pipewright-worker processes.

  - a pp 2 zb-h1 pipeline (I and W apart) of a GPT whose T (160) spans two
    key tiles and three query blocks: losses and final parameters equal
    `pipewright train`'s bit for bit;
  - peak RSS against the plan: a GPT at T 512 (d128, 2 layers, 4 heads,
    batch 2) on one worker with the plain and then the tiled attention;
    the measured drop of VmHWM equals the plan's drop (the saved
    probabilities and the T x T scratch against the lse and a few tiles)
    within 5 %, and the plan of the same job with train.attention left out
    ("auto") is the tiled one's. Under the sanitizer build the figures are
    printed, not held to (ASan's shadow and quarantine grow with use).
Usage: test_attention.py BUILD_DIR SOURCE_DIR"""
import json, os, subprocess, sys, tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_pipeline import Suite, job  # noqa: E402

MiB = 2 ** 20


def pipeline(t):
    spec = job("zb-h1", 2, 1, 2, steps=4, layers=4)
    spec["model"]["seq_len"] = 160
    spec["train"]["attention"] = "tiled"
    p, res, d = t.drive("tiled-zb-h1", spec)
    if not t.check("tiled zb-h1 pp 2: run completes", p.returncode == 0 and res is not None,
                   (p.stdout + p.stderr)[-600:]):
        return
    ref = t.reference(spec)
    c = subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "compare_run.py"),
                        os.path.join(d, "out", "result.json"), os.path.join(ref, "ref.jsonl"),
                        os.path.join(ref, "ref.safetensors"), "1e-6", "0", "0"], capture_output=True, text=True)
    t.check("tiled zb-h1 pp 2: the same losses and parameters as pipewright train, bit for bit",
            c.returncode == 0, (c.stdout + c.stderr).strip())


def memory(t):
    hwm, planned = {}, {}
    for impl in ("plain", "tiled", None):
        spec = job("1f1b", 1, 1, 1, steps=2, layers=2)
        spec["model"].update(seq_len=512, d_model=128, n_heads=4)
        spec["train"].update(batch_size=2, snapshot_every=0)
        if impl:
            spec["train"]["attention"] = impl
        label = f"mem-{impl or 'auto'}"
        if impl is None:  # the plan alone: which kernel auto takes
            d = os.path.join(t.tmp, label)
            os.makedirs(d)
            path = os.path.join(d, "job.json")
            json.dump(spec, open(path, "w"))
            out = subprocess.run([os.path.join(t.build, "pipewright"), "plan", "--job", path, "--json"],
                                 capture_output=True, text=True, cwd=t.src)
            rank = json.loads(out.stdout)["analytics"]["ranks"][0] if out.returncode == 0 else {}
            t.check("auto at T 512, 4 heads of 32: the tiled attention's plan", rank.get("memory_bytes") ==
                    planned.get("tiled"), f"{rank.get('memory_bytes')} vs tiled {planned.get('tiled')}")
            continue
        p, res, d = t.drive(label, spec)
        if not t.check(f"memory {impl}: run completes", p.returncode == 0 and res is not None and
                       "0" in res.get("vmhwm", {}), (p.stdout + p.stderr)[-400:]):
            return
        hwm[impl] = res["vmhwm"]["0"]
        planned[impl] = json.load(open(os.path.join(d, "out", "plan.json")))["analytics"]["ranks"][0]["memory_bytes"]
    got, want = hwm["plain"] - hwm["tiled"], planned["plain"] - planned["tiled"]
    line = (f"peak RSS plain {hwm['plain'] / MiB:.1f} MiB, tiled {hwm['tiled'] / MiB:.1f} MiB; planned "
            f"{planned['plain'] / MiB:.1f} and {planned['tiled'] / MiB:.1f} MiB; drop {got / MiB:.2f} MiB against "
            f"{want / MiB:.2f} MiB planned ({got / want:.3f})")
    print("note memory:", line, flush=True)
    if os.environ.get("PW_SANITIZE", "OFF") != "ON":
        t.check("memory: the peak RSS drop from plain to tiled is the plan's within 5 %",
                want > 8 * MiB and abs(got / want - 1) <= 0.05, line)


def main():
    build, src = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    with tempfile.TemporaryDirectory(prefix="pw-attention-") as tmp:
        t = Suite(build, src, tmp)
        pipeline(t)
        memory(t)
        print(f"{t.passed} passed, {t.failed} failed")
        return 1 if t.failed else 0


if __name__ == "__main__":
    sys.exit(main())

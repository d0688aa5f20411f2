#!/usr/bin/env python3
"""test_bf16_pipeline: train.precision "bf16" across real pipewright-worker processes
on 127.0.0.1 (driver.py), against the single-process trainer.

  - pp 2 x dp 2 under zb-h1 and 1f1b (4 microbatches, 3 steps of a small
    GPT): every per-step loss and every final parameter equal
    `pipewright train`'s bf16 run bit for bit (docs/contracts.md: the values
    a later layer reads are rounded to bf16 where they are made, so the wire
    carries them as bf16 without loss);
  - zb-h1 with partition.remat "full" (the forward run again before the
    backward rounds the same values again): the same bits too;
  - the same under PW_CPU=avx2 on both sides (the path of a host without
    AVX512_BF16: bf16 operands widened, OpenBLAS sgemm);
  - the activation frames of a bf16 run carry half the payload bytes of
    the float32 run's (the workers' end-of-run log line), as many frames;
  - bf16's losses stay within 2 % of float32's over the 3 steps.
Usage: test_bf16_pipeline.py BUILD_DIR SOURCE_DIR"""
import json, os, re, subprocess, sys, tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_pipeline import PY, Suite, job  # noqa: E402
sys.path.insert(0, os.path.join(HERE, "..", "ref"))
import st  # noqa: E402  (tests/ref/st.py)


def spec(name, precision, remat=False):
    s = job(name, 2, 1, 4, dp=2, steps=3, layers=4)
    s["train"]["precision"] = precision
    if remat:
        s["partition"] = {"mode": "even", "remat": "full"}
    return s


def act_bytes(d):
    """(frames, payload bytes) of activations the run's workers sent."""
    frames = nbytes = 0
    for f in os.listdir(os.path.join(d, "out")):
        if f.startswith("w") and f.endswith(".log"):
            for m in re.finditer(r"sent (\d+) activation frames, (\d+) payload bytes", open(os.path.join(d, "out", f)).read()):
                frames, nbytes = frames + int(m.group(1)), nbytes + int(m.group(2))
    return frames, nbytes


def main():
    build, src = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    with tempfile.TemporaryDirectory(prefix="pw-bf16-") as tmp:
        t = Suite(build, src, tmp)
        runs, outer = {}, os.environ.get("PW_CPU")  # CI's sanitized pass sets avx2
        for cpu in ("native", "avx2"):
            env = {"PW_CPU": cpu}
            os.environ["PW_CPU"] = cpu  # the single-process reference too
            t.refs = {}
            t.tmp = os.path.join(tmp, cpu)
            for name, remat in [("zb-h1", False), ("1f1b", False)] + [("zb-h1", True)] * (cpu == "native"):
                label = f"{name}{'-remat' if remat else ''}-bf16-{cpu}"
                s = spec(name, "bf16", remat)
                p, res, d = t.drive(label, s, env=env)
                if not t.check(f"{label}: run completes", p.returncode == 0 and res is not None,
                               (p.stdout + p.stderr)[-600:]):
                    continue
                ref = t.reference(s)
                # losses as the log prints them (8 digits); parameters byte for byte
                c = subprocess.run([PY, os.path.join(HERE, "compare_run.py"), os.path.join(d, "out", "result.json"),
                                    os.path.join(ref, "ref.jsonl"), os.path.join(ref, "ref.safetensors"), "1e-8"],
                                   capture_output=True, text=True)
                t.check(f"{label}: the single-process bf16 run's losses", c.returncode == 0,
                        (c.stdout + c.stderr).strip())
                a, b = st.load(res["merged"])[0], st.load(os.path.join(ref, "ref.safetensors"))[0]
                diff = [n for n in sorted(b) if n not in a or a[n].tobytes() != b[n].tobytes()]
                t.check(f"{label}: the single-process bf16 run's parameters bit for bit", len(b) > 0 and not diff,
                        f"{len(diff)} of {len(b)} tensors differ: {diff[:4]}")
                runs[label] = (res, d)
        os.environ.pop("PW_CPU")
        if outer is not None:
            os.environ["PW_CPU"] = outer
        t.tmp = tmp
        p, res, d = t.drive("1f1b-fp32", spec("1f1b", "fp32"))
        if t.check("1f1b-fp32: run completes", p.returncode == 0 and res is not None, (p.stdout + p.stderr)[-600:]) \
                and "1f1b-bf16-native" in runs:
            bres, bd = runs["1f1b-bf16-native"]
            (f32n, f32b), (bfn, bfb) = act_bytes(d), act_bytes(bd)
            t.check("bf16 activation frames carry half the bytes of float32's", f32n > 0 and bfn == f32n and
                    2 * bfb == f32b, f"float32 {f32n} frames {f32b} bytes, bf16 {bfn} frames {bfb} bytes")
            worst = max(abs(bres["losses"][k] - v) / v for k, v in res["losses"].items())
            t.check("bf16 losses within 2 % of float32's", worst < 0.02, f"worst {worst:.4f}")
            t.check("bf16 differs from float32 (it ran in bf16)", bres["losses"] != res["losses"])
    print(f"{t.passed} passed, {t.failed} failed")
    return 1 if t.failed or not t.passed else 0


if __name__ == "__main__":
    sys.exit(main())

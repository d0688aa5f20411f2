"""pipeline_gpu: a pp 2 pipeline of two workers on one GPU equals the
single-process GPU run (`pipewright train --device cuda`) bit for bit, for
1f1b and zb-h1 (issue 40), on a real coordinator and workers on loopback.

    python3 tests/gpu/pipeline_gpu.py BIN_DIR

BIN_DIR holds pipewright, pipewright-coordinator and pipewright-worker (a
build folder or a bundle's bin/). Prints 'ok:'/'FAIL:' lines; exit 1 on a
failure. Standard library only (the GPU machine has none of ours)."""
import json, os, subprocess, sys, tempfile

SRC = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(SRC, "tests", "integration"))
sys.path.insert(0, os.path.join(SRC, "tests", "ref"))
import driver as d  # noqa: E402

DEV = os.environ.get("PW_TEST_DEVICE", "cuda")  # cpu: the same check without a GPU (the script's own test)


def main():
    bin_dir = sys.argv[1]
    tmp = tempfile.mkdtemp(prefix="pw-gpu-pipe-")
    c = d.Cluster(bin_dir, tmp, "gpu", data_root=SRC)
    c.worker_args = ["--device", DEV]
    bad = 0
    try:
        c.start_worker("w0")
        c.start_worker("w1")
        if not c.wait_idle(2, 60):
            print(f"FAIL: pipeline: the two GPU workers did not register; "
                  f"{open(c.worker_log('w0')).read()[-600:]}")
            return 1
        for sched in ("1f1b", "zb-h1"):
            spec = d.tiny_gpt(f"gpu-{sched}", 3, 7, SRC)
            spec["schedule"] = {"name": sched, "microbatches": 4}
            spec["train"]["batch_size"] = 8
            jid = c.submit(spec)
            j = c.wait_job(jid, 120)
            f = os.path.join(tmp, f"{sched}.json")
            ref = os.path.join(tmp, f"{sched}-ref.safetensors")
            json.dump(spec, open(f, "w"))
            r = subprocess.run([os.path.join(bin_dir, "pipewright"), "train", "--job", f, "--device", DEV,
                                "--out", ref, "--quiet"], capture_output=True, text=True)
            if j.get("state") != "succeeded" or r.returncode:
                bad += 1
                print(f"FAIL: pipeline {sched}: job {j.get('state')} ({j.get('error') or ''}); "
                      f"train --device cuda exit {r.returncode} {r.stderr[-300:]}")
                continue
            diff = d.bit_diff(c.checkpoint(jid), open(ref, "rb").read())
            bad += bool(diff)
            print(f"{'FAIL' if diff else 'ok'}: pipeline {sched}: pp 2 on two {DEV} workers "
                  f"{diff or f'equals pipewright train --device {DEV} bit for bit'}")
    finally:
        c.stop()
        if bad:
            for n in ("w0", "w1"):
                print(f"--- {n}'s log:\n{open(c.worker_log(n)).read()[-1500:]}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

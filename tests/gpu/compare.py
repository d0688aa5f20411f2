"""compare: two training runs' checkpoints and step logs, CPU against GPU
(tests/gpu/run.sh). Prints one line per check, 'ok:' or 'FAIL:', and exits
1 on any failure.

    python3 tests/gpu/compare.py NAME CPU.safetensors GPU.safetensors CPU.jsonl GPU.jsonl [--loss 1e-4] [--weights 1e-4]

Losses and gradient norms: |gpu - cpu| / |cpu| per step, to 1e-4. Weights:
per tensor, max |gpu - cpu| / max |cpu|, to 1e-3 — tests/ref/compare.py's
definition and bound against PyTorch, for its reason: AdamW divides each
update by the gradient's own size, so an entry whose gradient is ~0 by
cancellation (a bias of a zero-initialised layer) moves by the rounding of
that sum, which differs between cuBLAS and the CPU's products. Every
tensor's figure is printed, the worst with its name. Standard library
only: the GPU machine has none of our Python environment."""
import argparse, array, json, struct, sys


def tensors(path):
    blob = open(path, "rb").read()
    n = struct.unpack("<Q", blob[:8])[0]
    hdr = json.loads(blob[8:8 + n])
    hdr.pop("__metadata__", None)
    out = {}
    for k, v in hdr.items():
        a = array.array("f")
        a.frombytes(blob[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
        out[k] = a
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("name")
    ap.add_argument("cpu_ckpt")
    ap.add_argument("gpu_ckpt")
    ap.add_argument("cpu_log")
    ap.add_argument("gpu_log")
    ap.add_argument("--loss", type=float, default=1e-4)
    ap.add_argument("--weights", type=float, default=1e-3)
    a = ap.parse_args()
    bad = 0
    rc = [json.loads(l) for l in open(a.cpu_log)]
    rg = [json.loads(l) for l in open(a.gpu_log)]
    for key in ("loss", "grad_norm"):
        lc, lg = [r[key] for r in rc], [r[key] for r in rg]
        worst = max(abs(x - y) / abs(x) for x, y in zip(lc, lg)) if lc and len(lc) == len(lg) else float("inf")
        ok = worst <= a.loss
        bad += not ok
        print(f"{'ok' if ok else 'FAIL'}: {a.name}: {len(lg)} steps' {key}, worst relative difference {worst:.2e} "
              f"(<= {a.loss:g}); cpu {['%.7g' % x for x in lc]} gpu {['%.7g' % x for x in lg]}")
    lg = rg
    tc, tg = tensors(a.cpu_ckpt), tensors(a.gpu_ckpt)
    if tc.keys() != tg.keys():
        print(f"FAIL: {a.name}: tensor names differ")
        return 1
    wname, wrel, each = "", 0.0, []
    for k in tc:
        c, g = tc[k], tg[k]
        top = max(abs(x) for x in c) or 1.0
        d = max(abs(x - y) for x, y in zip(c, g)) / top
        each.append(f"{k} {d:.1e}")
        if d != d or d > wrel:  # NaN counts as the worst
            wname, wrel = k, float("inf") if d != d else d
    ok = wrel <= a.weights
    bad += not ok
    print(f"{'ok' if ok else 'FAIL'}: {a.name}: weights after {len(lg)} steps, worst tensor {wname or '-'} at "
          f"{wrel:.2e} of its largest (<= {a.weights:g}); each: {', '.join(each)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

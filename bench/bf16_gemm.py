"""bf16_gemm: which matrix multiply train.precision "bf16" should use (issue 18).

    python3 bench/bf16_gemm.py [--build DIR] [--rounds N] [--reps R]

Runs bench_bf16_gemm (bench/bench_bf16_gemm.c) once per variant per round,
the variants interleaved (A B C D A B C D ...) so that load from other
processes hits all of them, one thread each:
  sgemm-haswell   OpenBLAS sgemm, OPENBLAS_CORETYPE=Haswell (what CI forces)
  sgemm-native    OpenBLAS sgemm, OPENBLAS_CORETYPE unset (AVX-512 kernels here)
  onednn-bf16     oneDNN bf16 matmul, f32 accumulate, conversions included
  widened-bf16    the no-AVX512_BF16 path: bf16 widened, sgemm (Haswell)
For every linear shape of the d512 bench GPT and layout (fwd, bwd_in, bwd_w)
prints the median ms over rounds with min-max, GFLOP/s, and the ratio of
each variant to sgemm-haswell and sgemm-native. Prints the load average.
"""
import argparse
import json
import os
import statistics
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))
VARIANTS = [("sgemm-haswell", "sgemm", "Haswell"), ("sgemm-native", "sgemm", None),
            ("onednn-bf16", "onednn", "Haswell"), ("widened-bf16", "widened", "Haswell")]
LAYOUTS = ["fwd", "bwd_in", "bwd_w"]


def run(exe, mode, core, reps):
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    env.pop("OPENBLAS_CORETYPE", None)
    if core:
        env["OPENBLAS_CORETYPE"] = core
    out = subprocess.run([exe, mode, str(reps)], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(os.path.dirname(HERE), "build-bench"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    exe = os.path.join(a.build, "bench", "bench_bf16_gemm")
    ms = {}  # (variant, shape, layout) -> [ms per round]
    info = {}
    for _ in range(a.rounds):
        for name, mode, core in VARIANTS:
            doc = run(exe, mode, core, a.reps)
            info[name] = (doc["core"], doc["impl"])
            for s in doc["shapes"]:
                for lay in LAYOUTS:
                    ms.setdefault((name, s["name"], lay), []).append(s[lay + "_ms"])
                    info[s["name"]] = (s["N"], s["C"], s["OC"])
    print(f"load: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f};"
          f" {a.rounds} rounds x {a.reps} reps, one thread")
    for name, _, _ in VARIANTS:
        print(f"  {name}: OpenBLAS core {info[name][0]}, path {info[name][1]}")
    print("| shape (N,C,OC) | layout | " + " | ".join(v[0] + " ms (min-max) GF/s" for v in VARIANTS) +
          " | bf16 vs haswell | bf16 vs native |")
    print("|---|---|" + "---|" * (len(VARIANTS) + 2))
    tot = {v[0]: 0.0 for v in VARIANTS}
    for shape in ["qkv", "proj", "fc", "fcproj", "lm_head"]:
        N, C, OC = info[shape]
        for lay in LAYOUTS:
            cells, med = [], {}
            for name, _, _ in VARIANTS:
                xs = ms[(name, shape, lay)]
                med[name] = statistics.median(xs)
                tot[name] += med[name]
                cells.append(f"{med[name]:.2f} ({min(xs):.2f}-{max(xs):.2f}) {2 * N * C * OC / med[name] / 1e6:.0f}")
            print(f"| {shape} ({N},{C},{OC}) | {lay} | " + " | ".join(cells) +
                  f" | {med['sgemm-haswell'] / med['onednn-bf16']:.2f} | {med['sgemm-native'] / med['onednn-bf16']:.2f} |")
    print("total ms per layer set: " + ", ".join(f"{k} {v:.1f}" for k, v in tot.items()))
    print(f"onednn-bf16 vs sgemm-haswell {tot['sgemm-haswell'] / tot['onednn-bf16']:.2f}x,"
          f" vs sgemm-native {tot['sgemm-native'] / tot['onednn-bf16']:.2f}x,"
          f" widened-bf16 vs sgemm-haswell {tot['sgemm-haswell'] / tot['widened-bf16']:.2f}x")


if __name__ == "__main__":
    main()

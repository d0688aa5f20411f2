#!/usr/bin/env python3
"""generate: tokens/s of `pipewright generate` against a PyTorch KV-cache
decode (tests/ref/generate_ref.py), one thread each, one sequence.

    /usr/bin/python3 bench/generate.py [--build DIR] [--rounds N] [--tokens N] [--prompt-len N]

The model is bench/jobs/gpt-d256.json's GPT (d=256, 4 layers, 4 heads,
byte vocabulary) with seq_len 256, at its initial parameters (`pipewright
train --steps 0`); greedy, a prompt of 32 bytes, 128 new tokens. Each round
runs pipewright (a fresh process: its own figure, prefill plus decode,
from the line it prints on stderr) and then PyTorch (in this process, after
one warm-up generation; the same span: the cache allocated before the clock
starts, prefill plus decode), OPENBLAS_NUM_THREADS=1 and
torch.set_num_threads(1). Prints each round, then the median ratio
pipewright / PyTorch in tokens/s with its min-max, and whether the two
greedy outputs agree. A measurement, not a test: no target.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(ROOT, "tests", "ref"))
import torch  # noqa: E402

import generate_ref as G  # noqa: E402
import torch_ref as R  # noqa: E402


def d256(tmp, pw, env):
    """The benchmark's model in tmp: (job, its file, its initial parameters)."""
    job = json.load(open(os.path.join(HERE, "jobs", "gpt-d256.json")))
    job["model"]["seq_len"] = 256
    job["data"]["path"] = os.path.join(ROOT, job["data"]["path"])
    jpath, ckpt = os.path.join(tmp, "job.json"), os.path.join(tmp, "init.safetensors")
    json.dump(job, open(jpath, "w"))
    subprocess.run([pw, "train", "--job", jpath, "--steps", "0", "--out", ckpt, "--quiet"], check=True, env=env)
    return job, jpath, ckpt


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--prompt-len", type=int, default=32)
    a = ap.parse_args()
    pw = os.path.join(a.build, "pipewright")
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        job, jpath, ckpt = d256(tmp, pw, env)
        prompt = list(open(os.path.join(ROOT, "examples/data/corpus.txt"), "rb").read(a.prompt_len))
        ids = ",".join(map(str, prompt))
        cfg = R.job_config(job)
        P, _ = R.load_params(cfg, ckpt)
        G.generate(P, cfg, prompt, a.tokens, G.Sampler())  # warm-up
        ratios, agree = [], True
        print(f"d256 L4 gpt, prompt {a.prompt_len}, {a.tokens} new tokens, greedy, 1 thread each")
        for r in range(a.rounds):
            out = subprocess.run([pw, "generate", "--job", jpath, "--checkpoint", ckpt, "--prompt-tokens", ids,
                                  "--max-tokens", str(a.tokens), "--threads", "1"],
                                 check=True, env=env, capture_output=True, text=True)
            pw_tps = float(re.search(r"([\d.]+) tokens/s", out.stderr).group(1))
            toks, secs = G.generate(P, cfg, prompt, a.tokens, G.Sampler())
            th_tps = a.tokens / secs
            agree &= out.stdout.strip() == ",".join(map(str, toks))
            ratios.append(pw_tps / th_tps)
            print(f"round {r + 1}: pipewright {pw_tps:8.1f} tokens/s   PyTorch {th_tps:8.1f} tokens/s   "
                  f"ratio {ratios[-1]:.3f}")
        print(f"ratio pipewright / PyTorch: median {statistics.median(ratios):.3f} "
              f"(min {min(ratios):.3f}, max {max(ratios):.3f}) over {a.rounds} rounds; "
              f"greedy outputs {'agree' if agree else 'DIFFER'}")


if __name__ == "__main__":
    main()

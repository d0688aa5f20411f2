"""torch_step: PyTorch's side of bench/run.sh case 2 (training step vs PyTorch).

    /usr/bin/python3 bench/torch_step.py --job JOB.json [--steps N] [--warmup W] [--threads K]
    /usr/bin/python3 bench/torch_step.py --job JOB.json --serve [--threads K]
    ... --autocast    the forward and loss under torch.autocast("cpu", dtype=torch.bfloat16)

Builds the job's GPT exactly as tests/ref/torch_ref.py does (the same
functional model over a parameter dict, imported from it: same
architecture, float32, AdamW with decay on 2-D tensors only, gradient
clipping, the same sequential batches). Without --serve it times W + N
training steps and prints one JSON object {"ms": [per-step ms of the N
timed steps], ...}. With --serve it speaks bench_step's protocol: prints
"ready", then trains one step per input line "step" and prints
{"ms": ..., "loss": ...}, until "quit" or EOF, so that the harness can
alternate single steps with pipewright's. Threads: torch.set_num_threads(K)
(the caller sets OMP_WAIT_POLICY). --foreach: the optimizer's multi-tensor
path (PyTorch's fastest AdamW on CPU in this version; the reference uses
the single-tensor path, whose arithmetic the contract names).
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "ref"))
import torch_ref  # noqa: E402


def make_trainer(job_path, foreach=False, autocast=False):
    """One training step per call of the returned function: (ms, loss)."""
    with open(job_path) as f:
        cfg = torch_ref.job_config(json.load(f))
    if cfg["M"] != 1:
        sys.exit("torch_step: the benchmark jobs use one microbatch")
    P, _ = torch_ref.load_params(cfg, None, torch_ref.random_init(cfg, cfg["seed"]))
    params = torch_ref.unique_params(P)
    opt = torch_ref.make_optimizer(cfg, params)
    if foreach:
        for g in opt.param_groups:
            g["foreach"] = True
    train_bytes = torch_ref.load_train_split(cfg, ROOT)
    V = cfg["V"]
    k = [0]

    def step():
        t0 = time.perf_counter()
        lr = torch_ref.lr_at(cfg, k[0])
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad(set_to_none=True)
        x, y = torch_ref.batch(train_bytes, cfg, k[0])
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = torch_ref.forward(P, cfg, x)
            loss = F.cross_entropy(logits.reshape(-1, V), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg["grad_clip"])
        opt.step()
        lv = loss.item()
        k[0] += 1
        return (time.perf_counter() - t0) * 1e3, lv

    return step, cfg


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--job", required=True)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--serve", action="store_true")
    ap.add_argument("--foreach", action="store_true", help="multi-tensor optimizer (fastest)")
    ap.add_argument("--autocast", action="store_true", help="forward and loss under bf16 autocast")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.set_default_dtype(torch.float32)
    step, cfg = make_trainer(a.job, a.foreach, a.autocast)
    if a.serve:
        print("ready", flush=True)
        for line in sys.stdin:
            if not line.startswith("step"):
                break
            ms, loss = step()
            print(json.dumps({"ms": ms, "loss": loss}), flush=True)
        return
    ms, losses = [], []
    for k in range(a.warmup + a.steps):
        dt, loss = step()
        losses.append(loss)
        if k >= a.warmup:
            ms.append(dt)
    print(json.dumps({"ms": ms, "loss": losses, "threads": a.threads,
                      "tokens_per_step": cfg["B"] * cfg["T"], "torch": torch.__version__}))


if __name__ == "__main__":
    main()

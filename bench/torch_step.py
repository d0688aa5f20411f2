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
(the caller sets OMP_WAIT_POLICY). --device cuda: on the GPU (TF32 off,
the fused AdamW, autocast on cuda). --foreach: the optimizer's multi-tensor
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


def to_device(P, dev):
    """The parameter dict on `dev`, tied parameters still one tensor."""
    moved = {}
    for k, p in P.items():
        if id(p) not in moved:
            moved[id(p)] = torch.nn.Parameter(p.detach().to(dev), requires_grad=p.requires_grad)
    return {k: moved[id(p)] for k, p in P.items()}


def make_trainer(job_path, foreach=False, autocast=False, device="cpu"):
    """One training step per call of the returned function: (ms, loss)."""
    with open(job_path) as f:
        cfg = torch_ref.job_config(json.load(f))
    if cfg["M"] != 1:
        sys.exit("torch_step: the benchmark jobs use one microbatch")
    P, _ = torch_ref.load_params(cfg, None, torch_ref.random_init(cfg, cfg["seed"]))
    cuda = device.startswith("cuda")
    if cuda:
        P = to_device(P, device)
    params = torch_ref.unique_params(P)
    opt = torch_ref.make_optimizer(cfg, params)
    for g in opt.param_groups:  # on a GPU its best: the fused AdamW
        if cuda:
            g["foreach"], g["fused"] = False, True
        elif foreach:
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
        if cuda:
            x, y = x.to(device), y.to(device)
        with torch.autocast("cuda" if cuda else "cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = torch_ref.forward(P, cfg, x)
            loss = F.cross_entropy(logits.reshape(-1, V), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg["grad_clip"])
        opt.step()
        lv = loss.item()  # waits for the GPU too
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
    ap.add_argument("--device", default="cpu", help="cpu, or cuda: the GPU, with the fused AdamW")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.set_default_dtype(torch.float32)
    if a.device.startswith("cuda"):  # float32 as float32, like pipewright's GPU products
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    step, cfg = make_trainer(a.job, a.foreach, a.autocast, a.device)
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
    print(json.dumps({"ms": ms, "loss": losses, "threads": a.threads, "device": a.device,
                      "tokens_per_step": cfg["B"] * cfg["T"], "torch": torch.__version__}))


if __name__ == "__main__":
    main()

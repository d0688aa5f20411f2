#!/usr/bin/env python3
"""generate_ref: generation with a KV cache in PyTorch — the reference for
`pipewright generate` (docs/contracts.md, "Generation").

    generate_ref.py --job J --checkpoint F --prompt-tokens 1,2,3
                    [--max-tokens N --temperature T --top-k K --top-p P --seed S]
        prints the generated ids as `pipewright generate --prompt-tokens` does
    generate_ref.py --self-check --job J [--job J2 ...]
        checks the cache against full recompute on random parameters

The model is torch_ref.py's (the contract's arithmetic over a dict of
parameters named as in the checkpoint); the cache is the usual PyTorch one:
per layer a preallocated (1, H, Tmax, hd) K and V, the prompt in one
forward, then one token per forward, each new query attending over the
cached keys of positions 0 .. its own. Learned positions and rotary angles
are taken at the absolute position. The sampler is a second implementation
of the contract's algorithm, with pipewright's RNG (common/base/rng.h) in
plain Python integers, so a seeded sample can be compared token for token.
"""
import argparse
import json
import math
import os
import sys
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import torch_ref as R  # noqa: E402

# ---------------------------------------------------------------------------
# pipewright's RNG (common/base/rng.h), mod 2^64.

M64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


def mix64(z):
    z ^= z >> 30
    z = (z * 0xBF58476D1CE4E5B9) & M64
    z ^= z >> 27
    z = (z * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def hash64(a, b):
    return mix64((mix64((a + GOLDEN) & M64) + b) & M64)


def hash_str(s):
    h = 0xCBF29CE484222325
    for c in s.encode():
        h = ((h ^ c) * 0x100000001B3) & M64
    return mix64(h)


class Rng:
    def __init__(self, key):
        self.s, x = [], key
        for _ in range(4):
            x = (x + GOLDEN) & M64
            self.s.append(mix64(x))

    def u64(self):
        s = self.s
        rotl = lambda x, k: ((x << k) | (x >> (64 - k))) & M64  # noqa: E731
        result = (rotl((s[1] * 5) & M64, 7) * 9) & M64
        t = (s[1] << 17) & M64
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = rotl(s[3], 45)
        return result

    def uniform(self):
        return (self.u64() >> 11) * 2.0 ** -53


class Sampler:
    """docs/contracts.md "Generation", step by step."""

    def __init__(self, temperature=0.0, top_k=0, top_p=1.0, seed=1):
        self.t, self.k, self.p = temperature, top_k, top_p
        self.rng = Rng(hash64(seed, hash_str("generate")))

    def __call__(self, logits):
        logits = [float(x) for x in logits]  # float32 -> double, exactly
        if self.t == 0:
            return max(range(len(logits)), key=lambda i: (logits[i], -i))
        z = [x / self.t for x in logits]
        order = sorted(range(len(z)), key=lambda i: (-z[i], i))
        n = self.k if 0 < self.k < len(z) else len(z)
        zmax = z[order[0]]
        w = [math.exp(z[order[j]] - zmax) for j in range(n)]
        total = 0.0
        for x in w:
            total += x
        if self.p < 1:
            run, want, j = 0.0, self.p * total, 0
            while True:
                run += w[j]
                j += 1
                if j >= n or run >= want:
                    break
            n, total = j, run
        r, run = self.rng.uniform() * total, 0.0
        for j in range(n):
            run += w[j]
            if run > r:
                return order[j]
        return order[n - 1]


# ---------------------------------------------------------------------------
# The model with a KV cache.

class Cached:
    def __init__(self, P, cfg, max_pos=None):
        self.P, self.cfg = P, cfg
        self.max_pos = max_pos or cfg["T"]
        H, hd = cfg["H"], cfg["d"] // cfg["H"]
        self.k = [torch.zeros(1, H, self.max_pos, hd) for _ in range(cfg["L"])]
        self.v = [torch.zeros(1, H, self.max_pos, hd) for _ in range(cfg["L"])]
        if cfg["template"] == "llama":
            self.cos, self.sin = R.rope_cos_sin(self.max_pos, hd, cfg["rope_base"])

    def attend(self, i, q, k, v, pos):
        """q, k, v (1, H, n, hd) of positions pos .. pos+n-1."""
        n = q.shape[2]
        self.k[i][:, :, pos:pos + n] = k
        self.v[i][:, :, pos:pos + n] = v
        K, V = self.k[i][:, :, :pos + n], self.v[i][:, :, :pos + n]
        att = (q @ K.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
        if n > 1:  # row r sees keys 0 .. pos+r
            mask = torch.ones(n, pos + n, dtype=torch.bool).tril(diagonal=pos)
            att = att.masked_fill(~mask, float("-inf"))
        return R.merge_heads(F.softmax(att, dim=-1) @ V)

    def forward(self, idx, pos):
        """idx (1, n) int64 at positions pos .. pos+n-1 -> logits (1, n, V)."""
        P, cfg = self.P, self.cfg
        n, d, H, eps = idx.shape[1], cfg["d"], cfg["H"], cfg["eps"]
        x = F.embedding(idx, P["embed.tok.weight"])
        gpt = cfg["template"] == "gpt"
        if gpt:
            x = x + P["embed.pos.weight"][pos:pos + n]
        else:
            cos, sin = self.cos[pos:pos + n], self.sin[pos:pos + n]
        for i in range(cfg["L"]):
            p = f"blocks.{i}."
            if gpt:
                a = F.layer_norm(x, (d,), P[p + "ln1.weight"], P[p + "ln1.bias"], eps)
                q, k, v = R.split_heads(F.linear(a, P[p + "attn.qkv.weight"], P[p + "attn.qkv.bias"]), H)
                x = x + F.linear(self.attend(i, q, k, v, pos), P[p + "attn.proj.weight"], P[p + "attn.proj.bias"])
                m = F.layer_norm(x, (d,), P[p + "ln2.weight"], P[p + "ln2.bias"], eps)
                m = F.gelu(F.linear(m, P[p + "mlp.fc.weight"], P[p + "mlp.fc.bias"]), approximate="tanh")
                x = x + F.linear(m, P[p + "mlp.proj.weight"], P[p + "mlp.proj.bias"])
            else:
                a = R.rmsnorm(x, P[p + "norm1.weight"], eps)
                q, k, v = R.split_heads(F.linear(a, P[p + "attn.qkv.weight"]), H)
                q, k = R.apply_rope(q, cos, sin), R.apply_rope(k, cos, sin)
                x = x + F.linear(self.attend(i, q, k, v, pos), P[p + "attn.proj.weight"])
                m = R.rmsnorm(x, P[p + "norm2.weight"], eps)
                m = F.silu(F.linear(m, P[p + "mlp.gate.weight"])) * F.linear(m, P[p + "mlp.up.weight"])
                x = x + F.linear(m, P[p + "mlp.down.weight"])
        if gpt:
            x = F.layer_norm(x, (d,), P["ln_f.weight"], P["ln_f.bias"], eps)
        else:
            x = R.rmsnorm(x, P["norm_f.weight"], eps)
        return F.linear(x, P["lm_head.weight"])


def generate(P, cfg, prompt, n_gen, sampler):
    """Prefill, then one token per forward; returns (tokens, seconds)."""
    with torch.no_grad():
        model = Cached(P, cfg)  # the cache is allocated before the clock starts, as pipewright's
        t0 = time.perf_counter()
        logits = model.forward(torch.tensor([prompt], dtype=torch.int64), 0)
        out = [sampler(logits[0, -1].numpy())]
        for i in range(1, n_gen):
            logits = model.forward(torch.tensor([[out[-1]]], dtype=torch.int64), len(prompt) + i - 1)
            out.append(sampler(logits[0, -1].numpy()))
        return out, time.perf_counter() - t0


def check_limits(cfg, n, n_gen):
    if not 1 <= n <= cfg["T"] or not 1 <= n_gen <= cfg["T"] - n + 1:
        R.die(f"a prompt of {n} and {n_gen} new tokens do not fit seq_len {cfg['T']}")


# ---------------------------------------------------------------------------
# Self-check: the cache against full recompute (torch_ref.forward).

def self_check(cfg):
    torch.manual_seed(0)
    P, _ = R.load_params(cfg, None, init=R.random_init(cfg, 3))
    T, V = cfg["T"], cfg["V"]
    idx = torch.randint(0, V, (1, T))
    with torch.no_grad():
        full = R.forward(P, cfg, idx)[0]
        for k in (1, 5):
            model = Cached(P, cfg)
            rows = [model.forward(idx[:, :k], 0)[0]]
            rows += [model.forward(idx[:, t:t + 1], t)[0] for t in range(k, T)]
            got = torch.cat(rows)
            err = ((got - full).abs().max() / full.abs().max()).item()
            if err > 1e-5:
                R.die(f"self-check {cfg['template']}: cached logits differ from full recompute by {err:.2e}")
        prompt = idx[0, :3].tolist()
        naive = list(prompt)
        for _ in range(T - 3 + 1):
            naive.append(int(R.forward(P, cfg, torch.tensor([naive]))[0, -1].argmax()))
        cached, _ = generate(P, cfg, prompt, T - 3 + 1, Sampler())
        if cached != naive[3:]:
            R.die(f"self-check {cfg['template']}: greedy with the cache {cached} != naive {naive[3:]}")
    # The sampler: greedy is the first maximum; a tiny top-p is greedy; a seed repeats.
    assert Sampler()([1.0, 3.0, 3.0]) == 1
    assert all(Sampler(1.0, 0, 1e-9, s)([1.0, 3.0, 3.0]) == 1 for s in range(20))
    a, b = Sampler(1.0, seed=9), Sampler(1.0, seed=9)
    draws = [a([0.1, 0.2, 0.3]) for _ in range(50)]
    assert draws == [b([0.1, 0.2, 0.3]) for _ in range(50)] and len(set(draws)) == 3
    print(f"self-check {cfg['template']}: ok (cache = full recompute within 1e-5; greedy = naive)")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--job", action="append", required=True)
    ap.add_argument("--checkpoint")
    ap.add_argument("--prompt-tokens")
    ap.add_argument("--max-tokens", type=int, default=0)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--self-check", action="store_true")
    a = ap.parse_args()
    R.setup_torch()
    if a.self_check:
        for j in a.job:
            self_check(R.job_config(json.load(open(j))))
        return
    cfg = R.job_config(json.load(open(a.job[0])))
    P, _ = R.load_params(cfg, a.checkpoint)
    prompt = [int(x) for x in a.prompt_tokens.split(",")]
    n_gen = a.max_tokens or cfg["T"] - len(prompt) + 1
    check_limits(cfg, len(prompt), n_gen)
    out, _ = generate(P, cfg, prompt, n_gen, Sampler(a.temperature, a.top_k, a.top_p, a.seed))
    print(",".join(str(t) for t in out))


if __name__ == "__main__":
    main()

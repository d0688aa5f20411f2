"""torch_ref: an independent PyTorch reimplementation of a pipewright run.

pipewright's single-process trainer is checked against this file. It is
written from docs/contracts.md only (tensor
names and layouts, the sequential sampler, the learning-rate schedule,
clipping, AdamW), the way an outside user would reproduce a run, and shares
no code with pipewright: models are plain functional PyTorch over a dict of
parameters named as in the checkpoint, safetensors go through st.py.

    /usr/bin/python3 tests/ref/torch_ref.py --job JOB.json --init INIT.safetensors \
        --data-root DIR --losses OUT.jsonl --out FINAL.safetensors [--steps N]

loads every parameter of INIT (a missing, extra or mis-shaped tensor is an
error), trains train.steps steps (--steps N overrides train.steps, so it is
also the cosine horizon) and writes one JSON line per step
{"step", "loss", "lr", "grad_norm"} (loss: the step's mean loss before the
update; grad_norm: the global norm before clipping) and the final parameters
under the same names.

    torch_ref.py --self-check --job JOB.json [--job JOB2.json ...] --data-root DIR

checks the reference itself, without pipewright: random small init, the
loss at step 0 near ln(vocab), the loss falling over the run, 1 vs N
microbatches giving the same run, bit-identical reruns, the gpt block
against torch.nn.TransformerEncoderLayer, rotary embeddings against a
complex-number rotation, and compare.py's check rejecting a run with a
wrong beta2.
"""
import argparse
import fnmatch
import io
import json
import math
import os
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare  # noqa: E402
import moe_ref  # noqa: E402
import st  # noqa: E402


def die(msg):
    sys.exit(f"torch_ref: error: {msg}")


# ---------------------------------------------------------------------------
# Job spec: the fields this reference needs, with pipewright's defaults.

def job_config(job):
    m, t = job.get("model", {}), job.get("train", {})
    o = t.get("optimizer", {})
    tmpl = m.get("template")
    if tmpl not in ("gpt", "llama"):
        die(f"model.template: only gpt and llama are supported here, got {tmpl!r}")
    opt_name = o.get("name", "adamw")
    if opt_name not in ("adamw", "sgd"):
        die(f"train.optimizer.name: unsupported {opt_name!r}")
    lr = float(o.get("lr", 3e-4))
    cfg = {
        "template": tmpl,
        "V": int(m.get("vocab_size", 256)),
        "T": int(m["seq_len"]),
        "d": int(m["d_model"]),
        "L": int(m["n_layers"]),
        "H": int(m["n_heads"]),
        "ffn_hidden": int(m.get("ffn_hidden", 0)),
        "tie": bool(m.get("tie_embeddings", False)),
        "rope_base": float(m.get("rope_base", 10000.0)),
        "KV": int(m.get("n_kv_heads", m["n_heads"])),
        "rope_scaling": m.get("rope_scaling"),
        "qkv_bias": bool(m.get("qkv_bias", False)),
        "qk_norm": bool(m.get("qk_norm", False)),
        "mlp_act": m.get("mlp_act", "silu"),
        "embed_scale": bool(m.get("embed_scale", False)),
        "norm_offset": int(m.get("norm_offset", 0)),
        "eps": float(m.get("norm_eps", 1e-5)),
        "init_std": float(m.get("init_std", 0.02)),
        "steps": int(t.get("steps", 100)),
        "B": int(t.get("batch_size", 8)),
        "seed": int(t.get("seed", 1)),
        "grad_clip": float(t.get("grad_clip", 1.0)),
        "M": int(job.get("schedule", {}).get("microbatches", 1)),
        "opt": opt_name,
        "lr": lr,
        "min_lr": float(o.get("min_lr", lr / 10)),
        "warmup": int(o.get("warmup_steps", 0)),
        "betas": tuple(float(b) for b in o.get("betas", [0.9, 0.999])),
        "opt_eps": float(o.get("eps", 1e-8)),
        "wd": float(o.get("weight_decay", 0.01 if opt_name == "adamw" else 0.0)),
        "momentum": float(o.get("momentum", 0.0)),
        "data": job.get("data", {}),
        "trainable": t.get("trainable"),
        "lora": m.get("lora"),
        "moe": moe_ref.moe_config(m),
        "window": int(m.get("sliding_window", 0)),  # Mistral's: a query at p sees keys p - w + 1 .. p
    }
    cfg["hd"] = int(m.get("head_dim", cfg["d"] // cfg["H"]))  # each head's width (Qwen3's, Gemma-7B's)
    if cfg["d"] % cfg["H"] and "head_dim" not in m:
        die("model.n_heads must divide d_model")
    if cfg["H"] % cfg["KV"]:
        die("model.n_kv_heads must divide n_heads")
    if cfg["mlp_act"] not in ("silu", "gelu_tanh"):
        die(f"model.mlp_act: unsupported {cfg['mlp_act']!r}")
    rs = cfg["rope_scaling"]
    if rs is not None and rs.get("rope_type") != "llama3":
        die(f"model.rope_scaling.rope_type: only llama3 is supported here, got {rs.get('rope_type')!r}")
    if tmpl == "llama" and cfg["hd"] % 2:
        die("model: rotary embeddings need an even head_dim")
    if cfg["B"] % cfg["M"]:
        die("schedule.microbatches must divide train.batch_size")
    if cfg["data"].get("kind", "text") != "text":
        die("data.kind: only text is supported here")
    if cfg["data"].get("sampler") != "sequential":
        die("data.sampler: the reference needs \"sequential\"")
    return cfg


def hidden_size(cfg, init=None):
    """MLP hidden width: model.ffn_hidden, else read it from the init file,
    else the template default (gpt 4d, llama round_up(8d/3, 32))."""
    if cfg["ffn_hidden"]:
        return cfg["ffn_hidden"]
    d = cfg["d"]
    if cfg["template"] == "gpt":
        return 4 * d
    if init is not None and "blocks.0.mlp.gate.weight" in init:
        return int(init["blocks.0.mlp.gate.weight"].shape[0])
    return (8 * d // 3 + 31) // 32 * 32  # C integer division, as spec.h writes it


def param_shapes(cfg, h):
    """Ordered {name: shape} of the checkpoint contract."""
    V, T, d, L = cfg["V"], cfg["T"], cfg["d"], cfg["L"]
    s = {"embed.tok.weight": (V, d)}
    if cfg["template"] == "gpt":
        s["embed.pos.weight"] = (T, d)
        for i in range(L):
            p = f"blocks.{i}."
            s.update({p + "ln1.weight": (d,), p + "ln1.bias": (d,),
                      p + "attn.qkv.weight": (3 * d, d), p + "attn.qkv.bias": (3 * d,),
                      p + "attn.proj.weight": (d, d), p + "attn.proj.bias": (d,),
                      p + "ln2.weight": (d,), p + "ln2.bias": (d,),
                      p + "mlp.fc.weight": (h, d), p + "mlp.fc.bias": (h,),
                      p + "mlp.proj.weight": (d, h), p + "mlp.proj.bias": (d,)})
            if moe_ref.is_moe_block(cfg["moe"], i):  # its MLP is a mixture
                for k in ("fc.weight", "fc.bias", "proj.weight", "proj.bias"):
                    del s[p + "mlp." + k]
                s.update(moe_ref.moe_param_shapes(cfg["moe"], p, d, False))
        s.update({"ln_f.weight": (d,), "ln_f.bias": (d,)})
    else:
        hd = cfg["hd"]
        w = (cfg["H"] + 2 * cfg["KV"]) * hd  # q, then the n_kv_heads k and v heads
        for i in range(L):
            p = f"blocks.{i}."
            s.update({p + "norm1.weight": (d,), p + "attn.qkv.weight": (w, d)})
            if cfg["qkv_bias"]:
                s[p + "attn.qkv.bias"] = (w,)
            if cfg["qk_norm"]:
                s.update({p + "attn.q_norm.weight": (hd,), p + "attn.k_norm.weight": (hd,)})
            s.update({p + "attn.proj.weight": (d, cfg["H"] * hd), p + "norm2.weight": (d,)})
            if moe_ref.is_moe_block(cfg["moe"], i):
                s.update(moe_ref.moe_param_shapes(cfg["moe"], p, d, True))
            else:
                s.update({p + "mlp.gate.weight": (h, d), p + "mlp.up.weight": (h, d), p + "mlp.down.weight": (d, h)})
        s["norm_f.weight"] = (d,)
    if not cfg["tie"]:
        s["lm_head.weight"] = (V, d)
    lo = cfg["lora"]
    if lo:  # adapters on the linear layers a target matches: A [r, in], B [out, r]
        r = int(lo.get("rank", 8))
        for n, shape in list(s.items()):
            lname = n[:-len(".weight")]
            if n.endswith(".weight") and len(shape) == 2 and not n.startswith("embed.") and \
                    any(fnmatch.fnmatchcase(lname, t) for t in lo["targets"]):
                s[lname + ".lora_A.weight"] = (r, shape[1])
                s[lname + ".lora_B.weight"] = (shape[0], r)
    return s


def load_params(cfg, path, init=None):
    """Parameters from the safetensors file at path (or the dict init)."""
    if init is None:
        init, _ = st.load(path)
    h = hidden_size(cfg, init)
    want = param_shapes(cfg, h)
    missing = [n for n in want if n not in init]
    extra = [n for n in init if n not in want]
    bad = [f"{n}: file {list(init[n].shape)} {init[n].dtype}, expected {list(want[n])} float32"
           for n in want if n in init and (tuple(init[n].shape) != want[n] or init[n].dtype != np.float32)]
    if missing or extra or bad:
        die(f"{path} does not match the {cfg['template']} contract:"
            + "".join(f"\n  missing {n}" for n in missing)
            + "".join(f"\n  unexpected {n}" for n in extra)
            + "".join(f"\n  {b}" for b in bad))
    params = {n: torch.nn.Parameter(torch.from_numpy(init[n].copy())) for n in want}
    # train.trainable: a parameter no pattern matches is frozen, as a user
    # would freeze it in PyTorch (a tied lm_head is embed.tok.weight); with
    # LoRA and no train.trainable only the adapters train, as in PEFT
    pats = cfg["trainable"] or (["*.lora_A.weight", "*.lora_B.weight"] if cfg["lora"] else ["*"])
    for n, p in params.items():
        p.requires_grad_(any(fnmatch.fnmatchcase(n, pat) for pat in pats))
    if cfg["tie"]:
        params["lm_head.weight"] = params["embed.tok.weight"]
    return params, h


def random_init(cfg, seed):
    """Small-init parameters for self-checks: N(0, init_std) matrices, unit
    norm weights, zero biases."""
    rng = np.random.default_rng(seed)
    out = {}
    for n, shape in param_shapes(cfg, hidden_size(cfg)).items():
        if len(shape) >= 2:
            out[n] = (rng.standard_normal(shape) * cfg["init_std"]).astype(np.float32)
        elif n.endswith(".bias") or cfg["norm_offset"]:  # Gemma's norms: 1 + w, w = 0
            out[n] = np.zeros(shape, np.float32)
        else:
            out[n] = np.ones(shape, np.float32)
    return out


# ---------------------------------------------------------------------------
# Models: functional forward over the parameter dict.

def attention(q, k, v, window=0):
    """q, k, v: (B, H, T, hd). Causal softmax attention, scale 1/sqrt(hd);
    window > 0: query i sees keys i - window + 1 .. i only (transformers'
    Mistral: key j masked when j <= i - window)."""
    T, hd = q.shape[-2], q.shape[-1]
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    if window:
        mask = mask & ~torch.ones(T, T, dtype=torch.bool, device=q.device).tril(-window)
    att = att.masked_fill(~mask, float("-inf"))
    return F.softmax(att, dim=-1) @ v


def split_heads(qkv, H):
    """(B, T, 3d) with rows q | k | v, head h owning h*hd .. (h+1)*hd-1 of
    each -> three (B, H, T, hd)."""
    B, T, d3 = qkv.shape
    d = d3 // 3
    q, k, v = qkv.split(d, dim=-1)
    return [x.view(B, T, H, d // H).transpose(1, 2) for x in (q, k, v)]


def merge_heads(y):
    B, H, T, hd = y.shape
    return y.transpose(1, 2).contiguous().view(B, T, H * hd)


def llama3_inv_freq(inv_freq, rs):
    """transformers' _compute_llama3_parameters (rope_type llama3), float32."""
    factor, low, high = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
    old = rs["original_max_position_embeddings"]
    low_wl, high_wl = old / low, old / high
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_wl, inv_freq / factor, inv_freq)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * inv_freq_llama / factor + smooth * inv_freq_llama
    is_medium = ~(wavelen < high_wl) * ~(wavelen > low_wl)
    return torch.where(is_medium, smoothed, inv_freq_llama)


def rope_cos_sin(T, hd, base, scaling=None):
    """Hugging Face Llama rotary tables, (T, hd) each."""
    inv_freq = 1.0 / (base ** (torch.arange(0, hd, 2).float() / hd))
    if scaling:
        inv_freq = llama3_inv_freq(inv_freq, scaling)
    t = torch.arange(T).float()
    freqs = torch.outer(t, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x, cos, sin):
    return x * cos + rotate_half(x) * sin


def rmsnorm(x, w, eps, offset=0):
    """Llama's RMSNorm (x * rstd * w), or with offset 1 Gemma's: transformers'
    GemmaRMSNorm, x * rstd * (1.0 + w)."""
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y * (1.0 + w) if offset else y * w


def lin(P, name, x, cfg, bias=True):
    """The linear layer `name`, plus its LoRA adapter when it has one, as
    PEFT's lora.Linear: base(x) + lora_B(lora_A(x)) * (alpha / r)."""
    y = F.linear(x, P[name + ".weight"], P[name + ".bias"] if bias else None)
    if name + ".lora_A.weight" in P:
        lo = cfg["lora"]
        r = int(lo.get("rank", 8))
        y = y + F.linear(F.linear(x, P[name + ".lora_A.weight"]), P[name + ".lora_B.weight"]) * (
            float(lo.get("alpha", 8)) / r)
    return y


def gpt_block(P, p, x, cfg):
    d, eps = cfg["d"], cfg["eps"]
    a = F.layer_norm(x, (d,), P[p + "ln1.weight"], P[p + "ln1.bias"], eps)
    q, k, v = split_heads(lin(P, p + "attn.qkv", a, cfg), cfg["H"])
    x = x + lin(P, p + "attn.proj", merge_heads(attention(q, k, v)), cfg)
    m = F.layer_norm(x, (d,), P[p + "ln2.weight"], P[p + "ln2.bias"], eps)
    if p + "moe.router.weight" in P:
        return x + moe_ref.moe_ffn(P, p, m, cfg["moe"], "gelu")[0]
    m = F.gelu(lin(P, p + "mlp.fc", m, cfg), approximate="tanh")
    return x + lin(P, p + "mlp.proj", m, cfg)


def llama_block(P, p, x, cfg, cos, sin):
    eps, off = cfg["eps"], cfg["norm_offset"]
    a = rmsnorm(x, P[p + "norm1.weight"], eps, off)
    B, T, d = a.shape
    H, KV, hd = cfg["H"], cfg["KV"], cfg["hd"]
    qkv = lin(P, p + "attn.qkv", a, cfg, cfg["qkv_bias"])
    q, k, v = qkv.split([H * hd, KV * hd, KV * hd], dim=-1)
    q, k, v = q.view(B, T, H, hd), k.view(B, T, KV, hd), v.view(B, T, KV, hd)
    if cfg["qk_norm"]:  # Qwen3: q_norm, k_norm over each head's hd, before RoPE
        q = rmsnorm(q, P[p + "attn.q_norm.weight"], eps)
        k = rmsnorm(k, P[p + "attn.k_norm.weight"], eps)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    # Hugging Face's repeat_kv: kv head j serves query heads j*G .. j*G+G-1
    k, v = k.repeat_interleave(H // KV, dim=1), v.repeat_interleave(H // KV, dim=1)
    x = x + lin(P, p + "attn.proj", merge_heads(attention(q, k, v, cfg["window"])), cfg, False)
    m = rmsnorm(x, P[p + "norm2.weight"], eps, off)
    if p + "moe.router.weight" in P:
        return x + moe_ref.moe_ffn(P, p, m, cfg["moe"], cfg["mlp_act"])[0]
    g = lin(P, p + "mlp.gate", m, cfg, False)
    # Gemma's GeGLU (transformers' gelu_pytorch_tanh), else Llama's SwiGLU
    g = F.gelu(g, approximate="tanh") if cfg["mlp_act"] == "gelu_tanh" else F.silu(g)
    m = g * lin(P, p + "mlp.up", m, cfg, False)
    return x + lin(P, p + "mlp.down", m, cfg, False)


def forward(P, cfg, idx):
    """idx (B, T) int64 -> logits (B, T, V)."""
    T = idx.shape[1]
    x = F.embedding(idx, P["embed.tok.weight"])
    if cfg["template"] == "gpt":
        x = x + P["embed.pos.weight"][:T]
        for i in range(cfg["L"]):
            x = gpt_block(P, f"blocks.{i}.", x, cfg)
        x = F.layer_norm(x, (cfg["d"],), P["ln_f.weight"], P["ln_f.bias"], cfg["eps"])
    else:
        if cfg["embed_scale"]:  # GemmaModel: times sqrt(hidden_size) as a tensor of the activations' dtype
            x = x * torch.tensor(cfg["d"] ** 0.5, dtype=x.dtype)
        cos, sin = rope_cos_sin(T, cfg["hd"], cfg["rope_base"], cfg["rope_scaling"])
        cos, sin = cos.to(x.device), sin.to(x.device)  # bench/torch_step.py --device cuda
        for i in range(cfg["L"]):
            x = llama_block(P, f"blocks.{i}.", x, cfg, cos, sin)
        x = rmsnorm(x, P["norm_f.weight"], cfg["eps"], cfg["norm_offset"])
    return lin(P, "lm_head", x, cfg, False)


# ---------------------------------------------------------------------------
# Data, schedule, training.

def load_train_split(cfg, data_root, override=None):
    path = override or cfg["data"].get("path")
    if not path:
        die("data.path is missing")
    if not os.path.isabs(path):
        path = os.path.join(data_root, path)
    try:
        raw = np.fromfile(path, dtype=np.uint8)
    except OSError as e:
        die(f"data.path: {e}")
    ef = float(cfg["data"].get("eval_fraction", 0.1))
    n = len(raw) - int(math.floor(len(raw) * ef))
    if n - cfg["T"] - 1 <= 0:
        die(f"{path}: train split of {n} bytes is too short for seq_len {cfg['T']}")
    return raw[:n]


def batch(train, cfg, step):
    """Sequences 0..B-1 of `step`: inputs (B,T), targets (B,T), int64."""
    B, T = cfg["B"], cfg["T"]
    N = len(train)
    starts = [((step * B + i) * T) % (N - T - 1) for i in range(B)]
    x = np.stack([train[o:o + T] for o in starts]).astype(np.int64)
    y = np.stack([train[o + 1:o + T + 1] for o in starts]).astype(np.int64)
    return torch.from_numpy(x), torch.from_numpy(y)


def lr_at(cfg, k):
    lr, min_lr, warm, steps = cfg["lr"], cfg["min_lr"], cfg["warmup"], cfg["steps"]
    if k < warm:
        return lr * (k + 1) / warm
    return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * (k - warm) / max(1, steps - warm)))


def unique_params(P):
    """Parameters in contract order, each once (a tied lm_head is embed.tok)."""
    seen, out = set(), []
    for p in P.values():
        if id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out


def make_optimizer(cfg, params):
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg["wd"]},
              {"params": no_decay, "weight_decay": 0.0}]
    if cfg["opt"] == "adamw":
        return torch.optim.AdamW(groups, lr=cfg["lr"], betas=cfg["betas"], eps=cfg["opt_eps"],
                                 weight_decay=cfg["wd"], foreach=False)
    return torch.optim.SGD(groups, lr=cfg["lr"], momentum=cfg["momentum"], weight_decay=cfg["wd"],
                           foreach=False)


def train(cfg, P, train_bytes, log=None):
    """Runs cfg["steps"] steps in place on P; returns the per-step records."""
    params = [p for p in unique_params(P) if p.requires_grad]
    opt = make_optimizer(cfg, params)
    B, M, V = cfg["B"], cfg["M"], cfg["V"]
    b = B // M
    records = []
    for k in range(cfg["steps"]):
        lr = lr_at(cfg, k)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad(set_to_none=True)
        x, y = batch(train_bytes, cfg, k)
        loss_sum = 0.0
        for j in range(M):
            logits = forward(P, cfg, x[j * b:(j + 1) * b])
            loss = F.cross_entropy(logits.reshape(-1, V), y[j * b:(j + 1) * b].reshape(-1)) / M
            loss.backward()
            loss_sum += loss.item()
        if cfg["grad_clip"] > 0:
            gn = torch.nn.utils.clip_grad_norm_(params, cfg["grad_clip"])
        else:
            gn = torch.norm(torch.stack([torch.norm(p.grad.detach(), 2) for p in params]), 2)
        opt.step()
        rec = {"step": k, "loss": loss_sum, "lr": lr, "grad_norm": float(gn)}
        records.append(rec)
        if log is not None:
            log.write(json.dumps(rec) + "\n")
            log.flush()
    return records


def save_params(cfg, P, path):
    out = {n: p.detach().numpy() for n, p in P.items()
           if not (cfg["tie"] and n == "lm_head.weight")}
    st.save(path, out, {"producer": "tests/ref/torch_ref.py"})


def setup_torch():
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.set_default_dtype(torch.float32)


# ---------------------------------------------------------------------------
# Self-checks of the reference itself.

def check_gpt_block_against_torch(cfg):
    """Our gpt block equals nn.TransformerEncoderLayer(norm_first) with the
    same weights: checks the qkv row packing, head split, scale, mask, MLP."""
    d, H = cfg["d"], cfg["H"]
    h = hidden_size(cfg)
    P = {n: torch.from_numpy(a) for n, a in random_init(cfg, 7).items()}
    g = torch.Generator().manual_seed(3)
    for n in P:
        if n.startswith("blocks.0.") and P[n].dim() == 1:  # make norms and biases non-trivial
            P[n] = P[n] + 0.1 * torch.randn(P[n].shape, generator=g)
    layer = torch.nn.TransformerEncoderLayer(d, H, dim_feedforward=h, dropout=0.0,
                                             activation=lambda t: F.gelu(t, approximate="tanh"),
                                             layer_norm_eps=cfg["eps"], batch_first=True,
                                             norm_first=True)
    sd = {"self_attn.in_proj_weight": "attn.qkv.weight", "self_attn.in_proj_bias": "attn.qkv.bias",
          "self_attn.out_proj.weight": "attn.proj.weight", "self_attn.out_proj.bias": "attn.proj.bias",
          "linear1.weight": "mlp.fc.weight", "linear1.bias": "mlp.fc.bias",
          "linear2.weight": "mlp.proj.weight", "linear2.bias": "mlp.proj.bias",
          "norm1.weight": "ln1.weight", "norm1.bias": "ln1.bias",
          "norm2.weight": "ln2.weight", "norm2.bias": "ln2.bias"}
    layer.load_state_dict({k: P["blocks.0." + v] for k, v in sd.items()})
    layer.eval()
    x = torch.randn(3, cfg["T"], d, generator=g)
    mask = torch.triu(torch.full((cfg["T"], cfg["T"]), float("-inf")), diagonal=1)
    with torch.no_grad():
        want = layer(x, src_mask=mask)
        got = gpt_block(P, "blocks.0.", x, cfg)
    err = (got - want).abs().max().item()
    assert err < 1e-5, f"gpt block differs from nn.TransformerEncoderLayer by {err}"
    return err


def check_rope(cfg):
    """Rotate-half RoPE equals rotating the complex pairs (x_i, x_{i+hd/2})
    by t * base^(-2i/hd); and q.k after RoPE depends only on the offset."""
    T, hd, base = cfg["T"], cfg["d"] // cfg["H"], cfg["rope_base"]
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, T, hd, generator=g, dtype=torch.float64)
    cos, sin = rope_cos_sin(T, hd, base)
    got = apply_rope(x, cos.double(), sin.double())
    z = torch.complex(x[..., : hd // 2], x[..., hd // 2:])
    ang = torch.outer(torch.arange(T, dtype=torch.float64),
                      base ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    w = z * torch.polar(torch.ones_like(ang), ang)
    want = torch.cat((w.real, w.imag), dim=-1)
    err = (got - want).abs().max().item()
    # float32 angles t * inv_freq: the error grows with the position
    assert err < 1e-5 * max(1.0, T / 32), f"rotary embedding differs from the complex rotation by {err}"
    q, k = torch.randn(hd, generator=g), torch.randn(hd, generator=g)
    qs = apply_rope(q.expand(T, hd), cos, sin)
    ks = apply_rope(k.expand(T, hd), cos, sin)
    d1 = (qs[5] * ks[2]).sum().item()
    d2 = (qs[T - 1] * ks[T - 4]).sum().item()
    assert abs(d1 - d2) < 1e-4 * max(1.0, abs(d1)), f"RoPE not relative: {d1} vs {d2}"
    return err


def self_check(cfg, data_root, data_override):
    train_bytes = load_train_split(cfg, data_root, data_override)
    V = cfg["V"]
    init = random_init(cfg, cfg["seed"])
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "init.safetensors")
        st.save(path, init)
        runs = {}
        for M in sorted({1, cfg["M"], 2}):
            c = dict(cfg, M=M)
            P, _ = load_params(c, path)
            runs[M] = (train(c, P, train_bytes), {n: p.detach().clone() for n, p in P.items()})
        c = dict(cfg)
        P, _ = load_params(c, path)
        rerun = train(c, P, train_bytes)
    losses = [r["loss"] for r in runs[cfg["M"]][0]]
    print(f"  loss[0] {losses[0]:.6f} (ln V = {math.log(V):.6f}), loss[{len(losses) - 1}] {losses[-1]:.6f}")
    # logits of a small init are ~N(0, std^2 d): the expected loss is ln V + std^2 d / 2
    assert abs(losses[0] - math.log(V)) < 0.05, "step-0 loss of a small init is not ~ln(V)"
    assert losses[-1] < losses[0] - 1.0, "loss did not fall by more than 1 nat"
    assert [r["loss"] for r in rerun] == losses, "reruns are not bit-identical"
    worst_l = worst_w = 0.0
    for M in runs:
        for a, b in zip(runs[M][0], runs[1][0]):
            worst_l = max(worst_l, abs(a["loss"] - b["loss"]) / abs(b["loss"]))
        for n, t in runs[M][1].items():
            ref = runs[1][1][n]
            worst_w = max(worst_w, (t - ref).abs().max().item() / (ref.abs().max().item() + 1e-8))
    print(f"  microbatches {sorted(runs)}: worst loss rel diff {worst_l:.2e}, worst tensor {worst_w:.2e}")
    assert worst_l < 1e-5, "losses depend on the microbatch count"
    # Not tighter: the k part of attn.qkv.bias has a gradient that is zero in
    # exact arithmetic (softmax ignores a per-row constant), so Adam turns its
    # ~1e-11 rounding noise into drifts of ~5e-6 that differ between runs.
    assert worst_w < 1e-3, "final weights depend on the microbatch count"
    lrs = [r["lr"] for r in runs[1][0]]
    if cfg["warmup"] > 0:
        assert abs(lrs[0] - cfg["lr"] / cfg["warmup"]) < 1e-12
        assert abs(lrs[cfg["warmup"]] - cfg["lr"]) < 1e-12
    if cfg["template"] == "gpt":
        print(f"  gpt block vs nn.TransformerEncoderLayer: max diff {check_gpt_block_against_torch(cfg):.2e}")
    else:
        print(f"  rotary vs complex rotation: max diff {check_rope(cfg):.2e}")
    if cfg["opt"] == "adamw":
        # Negative control: the comparison must reject a subtly wrong run
        # (another beta2 than the job's), or passing it would mean little.
        P, _ = load_params(cfg, None, init)
        bad = train(dict(cfg, betas=(cfg["betas"][0], 0.99 if cfg["betas"][1] != 0.99 else 0.95)),
                    P, train_bytes)
        good_w = {n: t.numpy() for n, t in runs[cfg["M"]][1].items()}
        bad_w = {n: p.detach().numpy() for n, p in P.items()}
        fails = compare.compare(bad, runs[cfg["M"]][0], bad_w, good_w, out=io.StringIO())
        assert any("loss" in f for f in fails), "compare() accepted a run with a different beta2"
        print(f"  compare() rejects a run with another beta2: {len(fails)} failures")
    print(f"torch_ref self-check ({cfg['template']}): ok")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--job", required=True, action="append", help="job spec (repeatable with --self-check)")
    ap.add_argument("--init")
    ap.add_argument("--data-root", default=".")
    ap.add_argument("--data", help="text file to use instead of data.path")
    ap.add_argument("--losses")
    ap.add_argument("--out")
    ap.add_argument("--steps", type=int)
    ap.add_argument("--microbatches", type=int, help="override schedule.microbatches")
    ap.add_argument("--write-random-init", metavar="PATH", help="write a small random init and exit")
    ap.add_argument("--self-check", action="store_true")
    a = ap.parse_args()
    setup_torch()
    if a.self_check:
        for job in a.job:
            with open(job) as f:
                cfg = job_config(json.load(f))
            if a.microbatches:
                cfg["M"] = a.microbatches
            self_check(cfg, a.data_root, a.data)
        return
    if len(a.job) != 1:
        ap.error("exactly one --job, except with --self-check")
    with open(a.job[0]) as f:
        cfg = job_config(json.load(f))
    if a.steps is not None:
        cfg["steps"] = a.steps
    if a.microbatches:
        cfg["M"] = a.microbatches
        if cfg["B"] % cfg["M"]:
            die("--microbatches must divide train.batch_size")
    if a.write_random_init:
        st.save(a.write_random_init, random_init(cfg, cfg["seed"]))
        return
    if not (a.init and a.losses and a.out):
        ap.error("--init, --losses and --out are required")
    P, _ = load_params(cfg, a.init)
    train_bytes = load_train_split(cfg, a.data_root, a.data)
    with open(a.losses, "w") as log:
        train(cfg, P, train_bytes, log)
    save_params(cfg, P, a.out)


if __name__ == "__main__":
    main()

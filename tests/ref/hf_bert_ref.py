"""hf_bert_ref: BERT's import, export, logits and training against transformers.

    .venv-hf/bin/python tests/ref/hf_bert_ref.py PIPEWRIGHT SOURCE_DIR TMP

(test_hf_ref.sh runs it after hf_ref.py, in deploy/venv.sh hf's
environment: transformers 4.49.0 over Debian's PyTorch 1.13.) Tiny random
BertForMaskedLM and BertForSequenceClassification made by transformers
itself (pad_token_id 0, type_vocab_size 2, initializer_range 0.3 so that the
logits spread), saved with a BertTokenizerFast's tokenizer.json, and checks:
  - import-hf reads [MASK] and [SEP] from tokenizer.json (data.mask_token,
    model.sep_token);
  - `pipewright logits` equals transformers' logits to 1e-4 of the largest,
    on sequences with padding and [SEP]s, transformers given the attention
    mask ids != pad and the token types pipewright computes (0 through the
    first [SEP], 1 after, pads 0: what the tokenizer gives a padded pair);
  - export-hf -> import-hf gives the same spec and every tensor bit for bit;
    transformers loads the export (no missing or unexpected keys) with the
    original's logits exactly;
  - 3 AdamW steps (warmup 1, cosine, clipping) of `pipewright train --init`
    equal transformers' model + torch.optim.AdamW on the same batches, run
    in float64: losses to 1e-5 relative, every tensor to 1e-4 of its
    largest (the k third of attn.qkv.bias left out: its gradient is zero
    but for rounding, which AdamW scales up to ~lr; the same run in
    float32 is printed, itself up to ~1.5e-4 off float64 where pipewright
    is 3e-5). The
    batches are pipewright's sampler re-implemented here from data.c's
    rules (docs/contracts.md): masked-LM windows of a token file (random
    sampler) and labeled JSON Lines (sequential);
  - config fields and tensors the template cannot compute are refused by
    name, nothing written.
"""
import json
import math
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import torch
from safetensors.torch import load_file, save_file
import transformers as tf

PW, SRC, TMP = sys.argv[1], sys.argv[2], os.path.join(sys.argv[3], "bert")
os.makedirs(TMP, exist_ok=True)
torch.manual_seed(0)
torch.set_num_threads(1)
failures = []
WORDS = "the a of to and in is it you that he was for on are with as his they be at one have this from".split()
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS  # 5 + 26 = 31 ids
PAD, CLS, SEP, MASK, V = 0, 2, 3, 4, len(VOCAB)


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def pw(*args, ok=True):
    r = subprocess.run([PW, *args], capture_output=True, text=True, cwd=SRC)
    if ok and r.returncode != 0:
        print(r.stdout + r.stderr)
        raise SystemExit(f"FAILED: pipewright {' '.join(args)}")
    return r


def rel(a, b):
    return float((a - b).abs().max() / b.abs().max())


def same_tensors(a, b):
    ta, tb = load_file(a), load_file(b)
    return sorted(ta) == sorted(tb) and all(torch.equal(ta[k].view(torch.int32), tb[k].view(torch.int32)) for k in ta)


def types_of(ids, sep):
    """Token types as pipewright computes them (ops_enc.h): 0 through the
    first sep, 1 after, but a pad is type 0 wherever it is (as tokenizers pad)."""
    out = torch.zeros_like(ids)
    for r in range(ids.shape[0]):
        hit = (ids[r] == sep).nonzero()
        if len(hit):
            out[r, int(hit[0]) + 1:] = 1
    return out.masked_fill(ids == PAD, 0)


def hf_out(model, ids, labels=None):
    return model(ids, attention_mask=(ids != PAD).long(), token_type_ids=types_of(ids, SEP), labels=labels)


def tokenizer():
    d = os.path.join(TMP, "vocab")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "vocab.txt"), "w") as f:
        f.write("\n".join(VOCAB) + "\n")
    return tf.BertTokenizerFast(os.path.join(d, "vocab.txt"))


def sequences(T, n, seed):
    """n sequences of T ids: [CLS] words [SEP] words [SEP] then pads, of varied lengths."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        a, b = 1 + i % 4, (i * 3) % 5
        ids = [CLS] + torch.randint(5, V, (a,), generator=g).tolist() + [SEP]
        if b:
            ids += torch.randint(5, V, (b,), generator=g).tolist() + [SEP]
        out.append((ids + [PAD] * T)[:T])
    return out


def pw_logits(job, ck, seqs, path):
    args = ["logits", "--job", job, "--checkpoint", ck, "--out", path]
    for s in seqs:
        args += ["--tokens", ",".join(map(str, s))]
    pw(*args)
    return load_file(path)["logits"]


def make(name, cls, model):
    """Save model (with the tokenizer), import it, compare logits, round-trip."""
    d = os.path.join(TMP, name)
    hf = os.path.join(d, "hf")
    model.eval().save_pretrained(hf, safe_serialization=True)
    tokenizer().save_pretrained(hf)
    job, ck = os.path.join(d, "job.json"), os.path.join(d, "ck.safetensors")
    pw("import-hf", hf, "--job-out", job, "--out", ck, "--name", name)
    spec = json.load(open(job))
    if not cls:
        check(spec["data"].get("mask_token") == MASK and spec["model"].get("sep_token") == SEP,
              f"{name}: [MASK] and [SEP] read from tokenizer.json (data.mask_token {spec['data'].get('mask_token')}, "
              f"model.sep_token {spec['model'].get('sep_token')})")
    T = spec["model"]["seq_len"]
    seqs = sequences(T, 6, 1)
    ids = torch.tensor(seqs)
    with torch.no_grad():
        ref = hf_out(model, ids).logits
    got = pw_logits(job, ck, seqs, os.path.join(d, "lg.safetensors"))
    e = rel(got, ref)
    check(got.shape == ref.shape and e <= 1e-4,
          f"{name}: logits equal transformers' ({e:.2e} of the largest, {tuple(ref.shape)}, pads and [SEP]s)")
    ex = os.path.join(d, "export")
    pw("export-hf", "--job", job, "--checkpoint", ck, "--out", ex)
    job2, ck2 = os.path.join(d, "job2.json"), os.path.join(d, "ck2.safetensors")
    pw("import-hf", ex, "--job-out", job2, "--out", ck2, "--name", name,
       *([] if cls else ["--mask-token", str(MASK)]))
    m1, m2 = spec["model"], json.load(open(job2))["model"]
    check(m1 == m2 and same_tensors(ck, ck2), f"{name}: export -> import gives the same spec and every tensor bit for bit")
    kind = tf.BertForSequenceClassification if cls else tf.BertForMaskedLM
    back, info = kind.from_pretrained(ex, output_loading_info=True)
    with torch.no_grad():
        e2 = float((hf_out(back.eval(), ids).logits - ref).abs().max())
    check(not info["missing_keys"] and not info["unexpected_keys"] and e2 == 0,
          f"{name}: transformers loads the export ({info['missing_keys']} missing, {info['unexpected_keys']} unexpected)"
          f" with the original's logits (max diff {e2:.1e})")
    return d, hf, job, ck


# ---- pipewright's sampler, from data.c's rules ---------------------------------

M64 = (1 << 64) - 1


def mix(z):
    z ^= z >> 30
    z = (z * 0xbf58476d1ce4e5b9) & M64
    z ^= z >> 27
    z = (z * 0x94d049bb133111eb) & M64
    return z ^ (z >> 31)


def hash64(a, b):
    return mix((mix((a + 0x9e3779b97f4a7c15) & M64) + b) & M64)


def hash_str(s):
    h = 0xcbf29ce484222325
    for c in s.encode():
        h = ((h ^ c) * 0x100000001b3) & M64
    return mix(h)


class Rng:  # xoshiro256**, seeded by splitmix
    def __init__(self, key):
        self.s, x = [], key
        for _ in range(4):
            x = (x + 0x9e3779b97f4a7c15) & M64
            self.s.append(mix(x))

    def u64(self):
        s = self.s
        rotl = lambda x, k: ((x << k) | (x >> (64 - k))) & M64  # noqa: E731
        r = (rotl((s[1] * 5) & M64, 7) * 9) & M64
        t = (s[1] << 17) & M64
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = rotl(s[3], 45)
        return r

    def below(self, n):
        return self.u64() % n


def key(seed, split, k, i):
    return hash64(hash64(hash64(seed, hash_str(split)), k), i)


def mlm_corrupt(kk, x, K, mask, pad):
    """x corrupted in place at K positions; the targets."""
    r = Rng(hash64(kk, hash_str("mlm")))
    p = [t for t in range(len(x)) if x[t] != pad]
    for j in range(K):
        s = j + r.below(len(p) - j)
        p[j], p[s] = p[s], p[j]
    tg = [-100] * len(x)
    for j in range(K):
        tg[p[j]] = x[p[j]]
        u = r.below(10)
        if u < 8:
            x[p[j]] = mask
        elif u == 8:
            x[p[j]] = r.below(V)
    return tg


def mlm_batch(ids, spec, k):
    """Step k's batch of the random sampler over the train split of ids."""
    T, B, K = spec["model"]["seq_len"], spec["train"]["batch_size"], spec["model"]["mlm_predictions"]
    seed, mask = spec["train"]["seed"], spec["data"]["mask_token"]
    N = len(ids) - int(math.floor(len(ids) * spec["data"]["eval_fraction"]))
    xs, ys = [], []
    for i in range(B):
        kk = key(seed, "train", k, i)
        o = kk % (N - T - 1)
        x = list(ids[o:o + T])
        ys.append(mlm_corrupt(kk, x, K, mask, PAD))
        xs.append(x)
    return torch.tensor(xs), torch.tensor(ys)


def labeled_batch(rows, labels, spec, k):
    """Step k's batch of the sequential sampler over the train split of labeled rows."""
    B, n = spec["train"]["batch_size"], len(rows)
    S = n - int(math.floor(n * spec["data"]["eval_fraction"]))
    j = [(k * B + i) % S for i in range(B)]
    return torch.tensor([rows[a] for a in j]), torch.tensor([labels[a] for a in j])


def hf_train(d, tag, hf, spec, kind, batch, dtype):
    """transformers' model + torch.optim.AdamW over the same batches, in
    dtype; its losses to d/ref-TAG.jsonl, its weights under our names to
    d/ref-TAG.safetensors (import-hf of what it saves, widened float32)."""
    model = kind.from_pretrained(hf).to(dtype)
    model.train()  # dropout is 0 in these configs: train() changes nothing
    t, o = spec["train"], spec["train"]["optimizer"]
    params = list(model.parameters())  # the tied decoder (and its bias) once
    opt = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": o["weight_decay"]},
                             {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                            lr=o["lr"], betas=tuple(o["betas"]), eps=o["eps"], foreach=False)
    steps, w, lr, min_lr = t["steps"], o["warmup_steps"], o["lr"], o["min_lr"]
    with open(f"{d}/ref-{tag}.jsonl", "w") as log:
        for k in range(steps):
            lr_k = lr * (k + 1) / w if k < w else \
                min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * min(1.0, (k - w) / max(1, steps - w))))
            for g in opt.param_groups:
                g["lr"] = lr_k
            opt.zero_grad(set_to_none=True)
            x, y = batch(k)
            loss = hf_out(model, x, labels=y).loss
            loss.backward()
            gn = torch.nn.utils.clip_grad_norm_(params, t["grad_clip"])
            opt.step()
            log.write(json.dumps({"step": k, "loss": loss.item(), "lr": lr_k, "grad_norm": float(gn)}) + "\n")
    model.float().save_pretrained(f"{d}/trained-{tag}", safe_serialization=True)
    tokenizer().save_pretrained(f"{d}/trained-{tag}")
    pw("import-hf", f"{d}/trained-{tag}", "--job-out", f"{d}/trained-{tag}.json", "--out",
       f"{d}/ref-{tag}.safetensors", "--seq-len", str(spec["model"]["seq_len"]))
    # The k part of attn.qkv.bias has a gradient that is zero in exact
    # arithmetic (softmax ignores a per-row constant): AdamW turns each
    # side's rounding noise into steps of ~lr, so it is left out; q and v
    # are compared as tensors of their own (as test_torch_ref.sh does Qwen2's).
    for f in ("pw", f"ref-{tag}"):
        t = load_file(f"{d}/{f}.safetensors")
        for n in [n for n in t if n.endswith("attn.qkv.bias")]:
            b, c = t.pop(n), spec["model"]["d_model"]
            t[n + ".q"], t[n + ".v"] = b[:c].clone(), b[2 * c:].clone()
        save_file(t, f"{d}/{f}-cmp.safetensors")
    return load_file(f"{d}/ref-{tag}-cmp.safetensors")


def worst(a, b):
    """The largest max|a-b| / max|b| over the tensors, and its name."""
    return max((float((a[n] - b[n]).abs().max() / (b[n].abs().max() + 1e-8)), n) for n in b)


def train_both(name, d, hf, ck, spec, kind, batch):
    """pipewright train --init CK against transformers + torch.optim.AdamW.
    The reference runs in float64: in float32 it is itself off the exact
    answer by more than pipewright is (a gradient near zero for some
    element, which AdamW divides by its own size), so the float32 run's
    distance is printed beside, not asserted."""
    job = os.path.join(d, "train.json")
    json.dump(spec, open(job, "w"), indent=1)
    pw("train", "--job", job, "--init", ck, "--out", f"{d}/pw.safetensors", "--log-json", f"{d}/pw.jsonl", "--quiet")
    r64 = hf_train(d, "f64", hf, spec, kind, batch, torch.float64)
    r32 = hf_train(d, "f32", hf, spec, kind, batch, torch.float32)
    r = subprocess.run([sys.executable, os.path.join(SRC, "tests/ref/compare.py"), "--label", name,
                        "--loss-rtol", "1e-5", "--weight-rtol", "1e-4", "--a-losses", f"{d}/pw.jsonl",
                        "--a-final", f"{d}/pw-cmp.safetensors", "--b-losses", f"{d}/ref-f64.jsonl", "--b-final",
                        f"{d}/ref-f64-cmp.safetensors"], capture_output=True, text=True)
    print(r.stdout.strip())
    ours = load_file(f"{d}/pw-cmp.safetensors")
    (e_pw, n_pw), (e_32, n_32) = worst(ours, r64), worst(r32, r64)
    moved = float((ours["embed.ln.weight"] - load_file(ck)["embed.ln.weight"]).abs().max())
    check(r.returncode == 0 and moved > 0,
          f"{name}: {spec['train']['steps']} AdamW steps equal transformers + torch.optim.AdamW in float64 (losses "
          f"1e-5, tensors 1e-4: worst {e_pw:.1e} in {n_pw}; transformers in float32 is {e_32:.1e} off in {n_32}; "
          f"moved {moved:.1e})")


def refuse(label, src, needle, edit_cfg=None, edit_tensors=None):
    dst = os.path.join(TMP, "bad", label.replace(" ", "_"))
    shutil.copytree(src, dst)
    if edit_cfg:
        c = json.load(open(f"{dst}/config.json"))
        edit_cfg(c)
        json.dump(c, open(f"{dst}/config.json", "w"))
    if edit_tensors:
        t = load_file(f"{dst}/model.safetensors")
        edit_tensors(t)
        save_file(t, f"{dst}/model.safetensors", metadata={"format": "pt"})
    job, ck = f"{dst}.json", f"{dst}.safetensors"
    r = pw("import-hf", dst, "--job-out", job, "--out", ck, ok=False)
    written = [p for p in (job, ck) if os.path.exists(p)]
    check(r.returncode == 1 and needle in r.stderr and not written,
          f"refused, {label}: {r.stderr.strip()[:150]}" + (f" (but wrote {written})" if written else ""))


t0 = time.time()
common = dict(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
              max_position_embeddings=24, type_vocab_size=2, pad_token_id=PAD, initializer_range=0.3,
              hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
md, mhf, mjob, mck = make("bert-mlm", False, tf.BertForMaskedLM(tf.BertConfig(**common)))
cd, chf, cjob, cck = make("bert-cls", True, tf.BertForSequenceClassification(tf.BertConfig(num_labels=3, **common)))

# training: the imported jobs at seq_len 16 (the position table's first rows), 3 steps
TRAIN = {"steps": 3, "batch_size": 4, "seed": 7, "grad_clip": 1.0,
         "optimizer": {"name": "adamw", "lr": 2e-3, "min_lr": 2e-4, "warmup_steps": 1, "betas": [0.9, 0.999],
                       "eps": 1e-8, "weight_decay": 0.01}}
ids = []
for s in sequences(16, 60, 2):  # a token stream: sentences and a few pads, as a packed corpus might hold
    ids += [t for t in s if t != PAD] + [PAD] * (len(ids) % 3 == 0)
with open(f"{md}/corpus.tokens", "wb") as f:
    f.write(b"PWTOKENS" + np.array([1, 2, V, 0], "<u4").tobytes() + np.array([len(ids)], "<u8").tobytes())
    f.write(np.array(ids, "<u2").tobytes())
pw("import-hf", mhf, "--job-out", f"{md}/t16.json", "--out", f"{md}/ck16.safetensors", "--seq-len", "16")
spec = json.load(open(f"{md}/t16.json"))
spec["model"]["mlm_predictions"] = 3
spec["data"].update(path=f"{md}/corpus.tokens", sampler="random", eval_fraction=0.1)
spec["train"] = TRAIN
train_both("bert-mlm", md, mhf, f"{md}/ck16.safetensors", spec, tf.BertForMaskedLM, lambda k: mlm_batch(ids, spec, k))

rows, labels = sequences(16, 10, 3), [i % 3 for i in range(10)]
with open(f"{cd}/train.jsonl", "w") as f:
    for r_, l_ in zip(rows, labels):
        f.write(json.dumps({"tokens": [t for t in r_ if t != PAD], "label": l_}) + "\n")
pw("import-hf", chf, "--job-out", f"{cd}/t16.json", "--out", f"{cd}/ck16.safetensors", "--seq-len", "16")
spec_c = json.load(open(f"{cd}/t16.json"))
spec_c["data"].update(path=f"{cd}/train.jsonl", sampler="sequential", eval_fraction=0.2)
spec_c["train"] = TRAIN
train_both("bert-cls", cd, chf, f"{cd}/ck16.safetensors", spec_c, tf.BertForSequenceClassification,
           lambda k: labeled_batch(rows, labels, spec_c, k))

# refused by name, nothing written
refuse("hidden_act gelu_new", mhf, "hidden_act", lambda c: c.__setitem__("hidden_act", "gelu_new"))
refuse("relative positions", mhf, "position_embedding_type",
       lambda c: c.__setitem__("position_embedding_type", "relative_key"))
refuse("is_decoder", mhf, "is_decoder", lambda c: c.__setitem__("is_decoder", True))
refuse("regression head", chf, "num_labels", lambda c: (c.pop("id2label"), c.pop("label2id"), c.__setitem__("num_labels", 1)))
refuse("a missing tensor", mhf, "bert.encoder.layer.1.attention.self.value.bias",
       edit_tensors=lambda t: t.pop("bert.encoder.layer.1.attention.self.value.bias"))
refuse("a wrong shape", chf, "classifier.weight", edit_tensors=lambda t: t.__setitem__("classifier.weight", torch.zeros(4, 32)))
refuse("an untied decoder", mhf, "cls.predictions.decoder.weight",
       edit_tensors=lambda t: t.__setitem__("cls.predictions.decoder.weight", torch.zeros(V, 32)))

print(f"hf_bert_ref: {len(failures)} failure(s), {time.time() - t0:.1f} s")
sys.exit(1 if failures else 0)

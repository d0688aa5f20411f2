#!/usr/bin/env python3
"""test_pipeline: true MPMD runs across real pipewright-worker processes on
127.0.0.1, driven by driver.py, against the single-process trainer.

  - every schedule at pp 2 and 4 (V = 2 for the interleaved ones and
    DualPipeV): 10 steps of a GPT; per-step losses and final parameters
    equal `pipewright train`'s (tolerance 1e-5 relative; in practice equal
    to the last bit);
  - pp 2 x dp 2, and tied embeddings across the first and last stage
  - with --models (test_pipeline_models.sh, the plain build), those alone:
    the llama template with the model families' options (grouped-query
    heads, rope scaling, qkv bias, QK-norm, Gemma's at pp 4, a sliding
    window with heads of a width of their own), BERT (template bert: masked
    LM at pp 2 under zb-h1, the tied decoder on the last stage, the padding
    mask read off the tokens by both; the [CLS] classifier on labeled
    pairs), mixtures of experts (model.moe: pp 2 zb-h1, pp 2 x dp 2): the
    same bits;
  - pp 2 x dp 2 with tied embeddings and the wire's chunk limit forced down
    to 999 bytes (PW_WIRE_CHUNK, honoured by the worker for tests only):
    every activation, gradient, all-reduce arena and tied gradient crosses
    the links in chunks, and the result is still the same bits; a
    PW_WIRE_CHUNK that is not a byte count fails the run with a message;
  - train.trainable: a frozen first stage (tied embedding frozen too) at
    pp 2 x dp 2 under zb-h1 with checkpoints and a resume from one, and a
    trainable tied embedding across frozen blocks: the same bits as the
    single-process run;
  - model.lora: adapters on some linear layers (only they train; and with
    train.trainable adding ln_f) under zb-h1 at pp 2 x dp 2 and dualpipev:
    the same bits as the single-process run;
  - the measured peak of saved activations per rank equals the planner's
    simulated peak (1f1b, gpipe);
  - a checkpoint directory that cannot be made fails the run, naming it;
  - killing one worker mid-run: the others stop with an error naming the
    lost peer, no hang, clean exits;
  - random and truncated frames and control messages at live workers:
    they stay up and then run a valid job to the same result.
Usage: test_pipeline.py BUILD_DIR SOURCE_DIR [--quick]"""
import json, os, re, subprocess, sys, tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PY = "/usr/bin/python3"

FLAT = ["gpipe", "1f1b", "eager1f1b", "zb-h1"]
VIRTUAL = ["interleaved-1f1b", "interleaved-gpipe", "interleaved-1f1b-plus-one", "kimi-k2", "dualpipev"]


def job(name, pp, V, m, dp=1, tied=False, steps=10, layers=8):
    return {"name": f"pipe-{name}",
            "model": {"template": "gpt", "vocab_size": 256, "seq_len": 16, "d_model": 32, "n_layers": layers,
                      "n_heads": 2, "tie_embeddings": tied},
            "mesh": {"pp": pp, "dp": dp, "virtual_stages": V},
            "schedule": {"name": name, "microbatches": m},
            "train": {"steps": steps, "batch_size": m * dp * 2, "seed": 3, "grad_clip": 1.0,
                      "optimizer": {"name": "adamw", "lr": 3e-3, "warmup_steps": 3, "weight_decay": 0.1}},
            "data": {"kind": "text", "path": "examples/data/corpus.txt", "sampler": "sequential"}}


def llama(name, pp, m, layers=4, **opts):
    """A llama-template job with the Hugging Face families' options (issue 34)."""
    spec = job(name, pp, 1, m, layers=layers)
    spec["model"] = {"template": "llama", "vocab_size": 256, "seq_len": 16, "d_model": 32, "n_layers": layers,
                     "n_heads": 4, "ffn_hidden": 64, **opts}
    return spec


def bert(name, pp, m, layers=4, **opts):
    """A bert-template job (issue 34): masked LM over the corpus's bytes, [MASK] 256, commas as its padding
    token (masked as keys, never chosen; at most 3 in any window) and newlines as its separator (token types
    1 after the first), so a later stage's attention reads the tokens it draws itself."""
    spec = job(name, pp, 1, m, layers=layers)
    spec["model"] = {"template": "bert", "vocab_size": 257, "seq_len": 16, "d_model": 32, "n_layers": layers,
                     "n_heads": 4, "ffn_hidden": 64, "pad_token": 44, "sep_token": 10, "mlm_predictions": 3, **opts}
    spec["data"]["mask_token"] = 256
    return spec


def labeled_file(src, path, n=96):
    """JSON Lines of [CLS] a [SEP] b [SEP] from the corpus's lines (2 for [CLS], newline the separator), cut
    and padded by the reader to seq_len; the label a function of the line (its length less its commas, mod 3)."""
    lines = [l for l in open(os.path.join(src, "examples/data/corpus.txt"), "rb").read().split(b"\n") if l][:n]
    with open(path, "w") as f:
        for i, l in enumerate(lines):
            a, b = l[:5 + i % 4], l[9:13]
            f.write(json.dumps({"tokens": [2, *a, 10, *b, 10], "label": len(l.replace(b",", b"")) % 3}) + "\n")
    return path


class Suite:
    def __init__(self, build, src, tmp):
        self.build, self.src, self.tmp = build, src, tmp
        self.passed, self.failed, self.refs = 0, 0, {}

    def check(self, label, ok, detail=""):
        print(f"{'ok  ' if ok else 'FAIL'} {label}{(': ' + detail) if detail else ''}", flush=True)
        if ok:
            self.passed += 1
        else:
            self.failed += 1
        return ok

    def drive(self, label, spec, *extra, env=None):
        d = os.path.join(self.tmp, label)
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, "in.json")
        json.dump(spec, open(path, "w"))
        p = subprocess.run([PY, os.path.join(HERE, "driver.py"), "--job", path, "--build", self.build,
                            "--src", self.src, "--out", os.path.join(d, "out"), *extra],
                           capture_output=True, text=True, timeout=600,
                           env=dict(os.environ, **env) if env else None)
        res_path = os.path.join(d, "out", "result.json")
        res = json.load(open(res_path)) if os.path.exists(res_path) else None
        return p, res, d

    def reference(self, spec):
        """`pipewright train` on the same job (shared by runs it cannot tell apart)."""
        key = json.dumps([spec["model"], spec["schedule"]["microbatches"], spec["mesh"]["dp"],
                          spec["train"]["steps"], spec["train"].get("trainable"), spec["train"].get("optimizer"),
                          spec["train"].get("attention")], sort_keys=True)
        if key not in self.refs:
            d = os.path.join(self.tmp, f"ref{len(self.refs)}")
            os.makedirs(d)
            path = os.path.join(d, "job.json")
            json.dump(spec, open(path, "w"))
            subprocess.run([os.path.join(self.build, "pipewright"), "train", "--job", path, "--quiet",
                            "--log-json", os.path.join(d, "ref.jsonl"), "--out", os.path.join(d, "ref.safetensors")],
                           check=True, cwd=self.src)
            self.refs[key] = d
        return self.refs[key]

    def equal_run(self, label, spec, *extra, start=0, env=None):
        p, res, d = self.drive(label, spec, *extra, env=env)
        if not self.check(f"{label}: run completes", p.returncode == 0 and res is not None,
                          (p.stdout + p.stderr)[-600:]):
            return None
        ref = self.reference(spec)
        c = subprocess.run([PY, os.path.join(HERE, "compare_run.py"), os.path.join(d, "out", "result.json"),
                            os.path.join(ref, "ref.jsonl"), os.path.join(ref, "ref.safetensors"), "1e-5", str(start)],
                           capture_output=True, text=True)
        self.check(f"{label}: equals the single-process run", c.returncode == 0, (c.stdout + c.stderr).strip())
        self.check(f"{label}: workers exit cleanly", res["exit_codes"] == [0] * len(res["exit_codes"]),
                   str(res["exit_codes"]))
        return res, d


def check_trace(t, label, res):
    """A traced step's report splits it in order: each action waits (ready .. start), computes (.. end) and
    hands its outputs on (.. routed) before the next one's wait begins, and the step end's wait and work fit
    after the last; a rank that waits for its peer's frames shows it (bench/trace_step.py reads these)."""
    bad, waits = [], []
    for r, acts in res["actions"].items():
        tr = res.get("trace", {}).get(r, {})
        if len(tr.get("ready", [])) != len(acts) or len(tr.get("routed", [])) != len(acts):
            bad.append(f"rank {r}: {len(acts)} actions, trace {sorted(tr)}")
            continue
        prev, w = 0.0, 0.0
        for (kind, mb, st, t0, t1), ready, routed in zip(acts, tr["ready"], tr["routed"]):
            if not prev - 1e-9 <= ready <= t0 <= t1 <= routed:
                bad.append(f"rank {r} {kind}{mb}@s{st}: ready {ready} start {t0} end {t1} routed {routed} after {prev}")
            prev, w = routed, w + t0 - ready
        waits.append(w)
        if not (tr["end_wait"] >= 0 and tr["end_work"] >= 0 and tr["after"] >= 0 and tr["t0"] > 0 and
                tr["sleeps"] >= 0 and prev + tr["end_wait"] + tr["end_work"] <= tr["step_time"] + 1e-6):
            bad.append(f"rank {r}: step end {tr}")
    t.check(f"{label}: the traced step splits in order into wait, compute, send and step end", not bad, str(bad[:3]))
    t.check(f"{label}: a rank waits for its peer's frames, and the trace shows it", waits and max(waits) > 0,
            str(waits))


def families(t, src, tmp):
    """The model families' numerics pipelined (issues 34 and 38): the same
    schedules' runtime as main()'s, other models — run by
    test_pipeline_models.sh (--models), in the plain build, so that the
    sanitized suite's test_pipeline keeps to the runtime."""
    # The model families' options (issue 34) pipelined: Llama-3 (grouped-
    # query heads, rope scaling), Qwen2 (qkv bias, one kv head, tied),
    # Qwen3 (QK-norm), Gemma (GeGLU, scaled embeddings, 1 + w norms, tied)
    # at pp 4 with a schedule that splits the backward.
    t.equal_run("llama3-1f1b-pp2", llama("1f1b", 2, 4, n_kv_heads=2, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8}))
    t.equal_run("qwen2-zb-h1-pp2", llama("zb-h1", 2, 4, n_kv_heads=1, qkv_bias=True, tie_embeddings=True))
    t.equal_run("qwen3-1f1b-pp2", llama("1f1b", 2, 4, n_kv_heads=2, qk_norm=True))
    t.equal_run("gemma-zb-h1-pp4", llama("zb-h1", 4, 8, n_kv_heads=1, mlp_act="gelu_tanh", embed_scale=True,
                                         norm_offset=1, tie_embeddings=True))
    # Mistral's sliding window with heads of a width of their own (12 over
    # d_model 32 / 4 heads), through the tiled attention
    spec = llama("1f1b", 2, 4, n_kv_heads=2, head_dim=12, sliding_window=5)
    spec["train"]["attention"] = "tiled"
    t.equal_run("window-head-dim-1f1b-pp2", spec)
    # BERT: masked LM (the tied decoder across the first and last stage;
    # every stage's attention masks the padding it reads off the tokens)
    t.equal_run("bert-mlm-zb-h1-pp2", bert("zb-h1", 2, 4))
    # and the classifier on [CLS]: one label a sequence, padded by the reader
    spec = bert("1f1b", 2, 4, bert_head="classify", n_labels=3)
    del spec["model"]["mlm_predictions"], spec["data"]["mask_token"], spec["data"]["sampler"]
    spec["data"].update(kind="labeled", path=labeled_file(src, os.path.join(tmp, "pairs.jsonl")))
    t.equal_run("bert-classify-1f1b-pp2", spec)

    # Mixtures of experts (model.moe, issue 38): the routing is a function
    # of the microbatch's tokens only, so pipelining changes nothing; a
    # llama at pp 2 under zb-h1 (each glinear's W apart from its I), a gpt
    # with sigmoid gates, a shared expert, every other block, at pp 2 x dp 2.
    t.equal_run("moe-llama-zb-h1-pp2", llama("zb-h1", 2, 4, moe={"experts": 4, "top_k": 2, "ffn_hidden": 24}))
    spec = job("1f1b", 2, 1, 4, dp=2, layers=4)
    spec["model"]["moe"] = {"experts": 4, "top_k": 2, "ffn_hidden": 32, "gate": "sigmoid", "routed_scale": 2.0,
                            "shared_experts": 1, "every": 2}
    t.equal_run("moe-gpt-1f1b-pp2-dp2", spec)


def main():
    build, src = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    quick = "--quick" in sys.argv
    with tempfile.TemporaryDirectory(prefix="pw-pipe-") as tmp:
        t = Suite(build, src, tmp)
        if "--models" in sys.argv:
            families(t, src, tmp)
            print(f"{t.passed} passed, {t.failed} failed")
            return 1 if t.failed else 0
        for pp in (2, 4):
            for name in FLAT + VIRTUAL:
                if quick and pp == 4 and name not in ("1f1b", "dualpipev"):
                    continue
                V = 2 if name in VIRTUAL else 1
                out = t.equal_run(f"{name}-pp{pp}-V{V}", job(name, pp, V, 8))
                if out and name in ("1f1b", "gpipe"):
                    res, d = out
                    plan = json.load(open(os.path.join(d, "out", "plan.json")))
                    want = {str(r["rank"]): r["peak_activations"] for r in plan["analytics"]["ranks"]}
                    t.check(f"{name}-pp{pp}: measured peak activations = simulated", res["peak_act"] == want,
                            f"measured {res['peak_act']}, planned {want}")
                    check_trace(t, f"{name}-pp{pp}", res)
        t.equal_run("1f1b-pp2-dp2", job("1f1b", 2, 1, 4, dp=2))
        t.equal_run("1f1b-pp2-tied", job("1f1b", 2, 1, 4, tied=True))
        t.equal_run("dualpipev-pp2-tied", job("dualpipev", 2, 2, 4, tied=True))
        t.equal_run("zb-h1-pp2-dp2-tied", job("zb-h1", 2, 1, 4, dp=2, tied=True))

        # Frozen parameters (train.trainable): stage 0 wholly frozen, its W
        # skipped; the optimizer checkpoints hold only the trainable state and
        # a run resumes from them.
        spec = job("zb-h1", 2, 1, 4, dp=2, tied=True)
        spec["train"]["trainable"] = ["blocks.[4-7].*", "ln_f.*"]
        spec["train"]["checkpoint_every"] = 5
        out = t.equal_run("frozen-zb-h1-pp2-dp2-tied", spec)
        if out:
            res, d = out
            mid = os.path.join(d, "out", "ckpt", "job-1", "step-5")
            t.equal_run("frozen-resume-from-5", spec, "--resume", mid, "--start-step", "5", start=5)
        spec = job("1f1b", 2, 1, 4, tied=True)
        spec["train"]["trainable"] = ["embed.tok.weight", "blocks.7.*"]
        t.equal_run("frozen-1f1b-pp2-tied-trains", spec)
        # LoRA (model.lora): adapter nodes in the stage programs, only they train
        spec = job("zb-h1", 2, 1, 4, dp=2)
        spec["model"]["lora"] = {"rank": 4, "alpha": 8, "targets": ["blocks.*.attn.qkv", "blocks.*.mlp.fc", "lm_head"]}
        t.equal_run("lora-zb-h1-pp2-dp2", spec)
        spec = job("dualpipev", 2, 2, 4)
        spec["model"]["lora"] = {"rank": 2, "targets": ["blocks.[0-3].mlp.*"]}
        spec["train"]["trainable"] = ["*.lora_?.weight", "ln_f.*"]
        t.equal_run("lora-dualpipev-pp2", spec)

        # Chunked transfers: an odd limit, so chunks split floats too.
        out = t.equal_run("zb-h1-pp2-dp2-tied-chunked", job("zb-h1", 2, 1, 4, dp=2, tied=True),
                          env={"PW_WIRE_CHUNK": "999"})
        if out:
            res, d = out
            sent = [re.findall(r"sent (\d+) tensors over 999 bytes as (\d+) chunks",
                               open(os.path.join(d, "out", f"w{i}.log")).read()) for i in range(4)]
            t.check("chunked: every rank sent its tensors in chunks",
                    all(s and int(s[0][1]) > int(s[0][0]) > 0 for s in sent), str(sent))
        p, res, d = t.drive("chunk-env-bad", job("1f1b", 2, 1, 4, steps=2), env={"PW_WIRE_CHUNK": "0"})
        msgs = [e["message"] for e in res["errors"]] if res else []
        t.check("chunked: PW_WIRE_CHUNK=0 fails the run, saying why",
                len(msgs) == 2 and all("PW_WIRE_CHUNK '0' is not a byte count" in m for m in msgs) and not res["done"],
                str(msgs) + (p.stdout + p.stderr)[-300:])

        # Checkpoints every 5 steps; a second run resumes from step 5 and ends
        # where the straight run ends.
        spec = job("interleaved-1f1b", 2, 2, 4)
        spec["train"]["checkpoint_every"] = 5
        out = t.equal_run("ckpt-every-5", spec)
        if out:
            res, d = out
            mid = os.path.join(d, "out", "ckpt", "job-1", "step-5")
            t.check("checkpoint at step 5 of every stage",
                    sorted(os.listdir(mid)) == sorted([f"stage-{s}.safetensors" for s in range(4)] +
                                                      [f"stage-{s}.optim.safetensors" for s in range(4)]),
                    str(os.listdir(mid)))
            t.equal_run("resume-from-5", spec, "--resume", mid, "--start-step", "5", start=5)

        # A file where the checkpoint directory should go: the run fails, saying where and why.
        spec = job("1f1b", 2, 1, 4, steps=2)
        spec["train"]["checkpoint_every"] = 1
        os.makedirs(os.path.join(tmp, "ckpt-blocked", "out"))
        open(os.path.join(tmp, "ckpt-blocked", "out", "ckpt"), "w").close()
        p, res, d = t.drive("ckpt-blocked", spec)
        msgs = [e["message"] for e in res["errors"]] if res else []
        want = os.path.join(d, "out", "ckpt", "job-1")
        t.check("checkpoint dir that cannot be made fails the run with its path and errno",
                msgs and all(f"cannot make the directories of {want}" in m and "Not a directory (errno 20)" in m
                             for m in msgs) and not res["done"], str(msgs) + (p.stdout + p.stderr)[-300:])

        # Forward-only (inference) plans: the same losses as `pipewright train`
        # on a forward-mode job, no update.
        fspec = job("interleaved-1f1b", 2, 2, 4, steps=4)
        fspec["mode"] = "forward"
        p, res, d = t.drive("forward-only", fspec)
        if t.check("forward-only: run completes", p.returncode == 0 and res is not None, (p.stdout + p.stderr)[-600:]):
            out = subprocess.run([os.path.join(build, "pipewright"), "train", "--job", os.path.join(d, "out", "job.json")],
                                 capture_output=True, text=True, cwd=src).stdout
            # "batch N/M  loss L": N batches done, the driver's losses keyed by the 0-based index
            want = {str(int(ln.split()[1].split("/")[0]) - 1): float(ln.split()[3])
                    for ln in out.splitlines() if ln.startswith("batch ")}
            got = res["losses"]
            t.check("forward-only: losses equal the single-process forward",
                    len(want) == 4 and all(abs(got.get(k, 1e9) - v) <= 1e-6 * abs(v) for k, v in want.items()),
                    f"{got} vs {want}")

        # A worker killed mid-run: the others stop, naming it.
        p, res, d = t.drive("kill", job("1f1b", 4, 1, 8, steps=200), "--kill-rank", "2", "--kill-at-step", "3")
        if t.check("kill: driver finished", res is not None and not res["timed_out"], (p.stdout + p.stderr)[-600:]):
            msgs = [e["message"] for e in res["errors"]]
            t.check("kill: every other rank reports the lost peer",
                    # the read side sees the close ("lost peer rank 2"); a rank writing to it at
                    # that moment sees the reset first ("send to rank 2: ...") — it cannot tell a
                    # killed peer from one that aborted, so it does not call it lost
                    len(msgs) == 3 and all("lost peer rank 2" in m or "send to rank 2: " in m for m in msgs), str(msgs))
            t.check("kill: no run reported done", res["done"] == [], str(res["done"]))
            t.check("kill: survivors exit cleanly", [c for i, c in enumerate(res["exit_codes"]) if i != 2] == [0, 0, 0],
                    str(res["exit_codes"]))

        # Garbage at live workers, then a valid job.
        out = t.equal_run("fuzz-then-1f1b", job("1f1b", 2, 1, 4), "--fuzz")
        if out:
            res, d = out
            logs = "".join(open(os.path.join(d, "out", f"w{i}.log")).read() for i in range(2))
            t.check("fuzz: bad frames were refused with a reason", "is not \"PWF1\"" in logs and "header_crc" in logs)
            t.check("fuzz: the worker fed bad control messages registered again", res["registrations"] >= 3,
                    f"{res['registrations']} registrations")
        print(f"{t.passed} passed, {t.failed} failed")
        return 1 if t.failed else 0


if __name__ == "__main__":
    sys.exit(main())

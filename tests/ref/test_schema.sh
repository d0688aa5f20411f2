#!/usr/bin/env bash
# test_schema: api/job.schema.json is a valid draft 2020-12 schema, every
# example job in examples/jobs/ satisfies it, a set of valid specs of each
# kind does, and structurally broken specs do not. Uses Debian's
# python3-jsonschema; exit 77 (skip) when it is missing.
# Arguments (from ctest): BUILD_DIR SOURCE_DIR.
set -euo pipefail
SRC="${2:-$(cd "$(dirname "$0")/../.." && pwd)}"
PY=/usr/bin/python3
if ! "$PY" -c 'import jsonschema; jsonschema.Draft202012Validator' 2>/dev/null; then
  echo "SKIP test_schema: python3-jsonschema (draft 2020-12) not installed"
  exit 77
fi
exec "$PY" - "$SRC" <<'EOF'
import glob, json, os, sys
import jsonschema

src = sys.argv[1]
with open(os.path.join(src, "api/job.schema.json")) as f:
    schema = json.load(f)
jsonschema.Draft202012Validator.check_schema(schema)
v = jsonschema.Draft202012Validator(schema)
fails = 0

def check(name, spec, want_ok):
    global fails
    errs = sorted(v.iter_errors(spec), key=lambda e: list(e.absolute_path))
    if bool(errs) == want_ok:
        fails += 1
        why = "; ".join("%s: %s" % ("/".join(map(str, e.absolute_path)), e.message[:200]) for e in errs[:3])
        print("FAIL %s: expected %s%s" % (name, "valid" if want_ok else "invalid", (" (" + why + ")") if why else ""))

examples = sorted(glob.glob(os.path.join(src, "examples/jobs/*.json")))
for path in examples:
    with open(path) as f:
        check(os.path.relpath(path, src), json.load(f), True)

gpt = {"name": "gpt-tiny",
       "model": {"template": "gpt", "vocab_size": 256, "seq_len": 64, "d_model": 64, "n_layers": 4,
                 "n_heads": 4, "tie_embeddings": False},
       "mesh": {"pp": 2, "dp": 1, "virtual_stages": 1},
       "schedule": {"name": "1f1b", "microbatches": 4},
       "partition": {"mode": "even"},
       "train": {"steps": 100, "batch_size": 8, "seed": 1, "grad_clip": 1.0, "checkpoint_every": 50,
                 "optimizer": {"name": "adamw", "lr": 3e-3, "min_lr": 3e-4, "warmup_steps": 10,
                               "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
       "data": {"kind": "text", "path": "examples/data/corpus.txt", "sampler": "sequential"}}
llama = {"model": {"template": "llama", "seq_len": 32, "d_model": 64, "n_layers": 2, "n_heads": 4,
                   "rope_base": 10000}, "data": {"kind": "copy"}}
mlp = {"model": {"template": "mlp", "in_dim": 4, "hidden_dim": 16, "out_dim": 3, "n_layers": 2,
                 "loss": "cross_entropy"}, "data": {"kind": "classify"},
       "train": {"optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.9}}}
layers = {"model": {"input": {"kind": "tokens"}, "seq_len": 16, "layers": [
              {"type": "embedding", "vocab_size": 256, "out": 32}, {"type": "pos_embedding"},
              {"type": "gpt_block", "n_heads": 4}, {"stage_boundary": {}},
              {"type": "llama_block", "n_heads": 4}, {"type": "rmsnorm"},
              {"type": "linear", "out": 256, "bias": False}, {"type": "cross_entropy"}]},
          "mesh": {"pp": 2}, "partition": {"mode": "markers"},
          "data": {"kind": "text", "path": "corpus.txt"}}
feat = {"model": {"input": {"kind": "features", "dim": 8}, "layers": [
            {"type": "linear", "out": 16}, {"type": "relu"}, {"type": "linear", "in": 16, "out": 1},
            {"type": "mse"}]},
        "partition": {"mode": "balanced", "layer_times": [1, 2, 3, 0.5], "byte_cost": 0},
        "data": {"kind": "regression"}}
bert = {"model": {"template": "bert", "vocab_size": 30522, "seq_len": 128, "d_model": 64, "n_layers": 2,
                  "n_heads": 4, "pad_token": 0, "sep_token": 102, "mlm_predictions": 19},
        "data": {"kind": "tokens", "path": "wiki.tokens", "mask_token": 103}}
bert_cls = {"model": {"template": "bert", "seq_len": 32, "d_model": 64, "n_layers": 2, "n_heads": 4,
                      "bert_head": "classify", "n_labels": 2, "pad_token": 0}, "data": {"kind": "labeled", "path": "x.jsonl"}}
specs = [("gpt", gpt), ("llama", llama), ("mlp", mlp), ("layers", layers), ("features", feat), ("bert", bert),
         ("bert classify", bert_cls)]
for name, spec in specs:
    check(name, spec, True)

def patched(base, path, value):
    s = json.loads(json.dumps(base))
    o = s
    for k in path[:-1]:
        o = o.setdefault(k, {}) if isinstance(k, str) else o[k]
    if value is None:
        del o[path[-1]]
    else:
        o[path[-1]] = value
    return s

broken = [
    (gpt, ["model", "d_modle"], 5), (gpt, ["bogus"], 1), (gpt, ["train", "steps"], 1.5),
    (gpt, ["train", "steps"], -1), (gpt, ["model", "seq_len"], None), (gpt, ["model", "vocab_size"], 1),
    (gpt, ["model", "rope_base"], 500), (gpt, ["schedule", "name"], "1F1B"), (gpt, ["mode"], "decode"),
    (gpt, ["name"], "a\nb"), (gpt, ["name"], ""), (gpt, ["mesh", "pp"], 0),
    (gpt, ["train", "optimizer", "betas"], [0.9, 1.0]), (gpt, ["train", "optimizer", "momentum"], 0.9),
    (gpt, ["train", "optimizer", "lr"], 0), (gpt, ["data", "kind"], "regression"),
    (gpt, ["data", "path"], None), (gpt, ["data", "eval_fraction"], 1), (gpt, ["model", "vocab_size"], 100),
    (gpt, ["partition", "layer_times"], [1.0]), (gpt, ["model"], None), (gpt, ["data"], None),
    (mlp, ["data", "kind"], "regression"), (mlp, ["model", "hidden_dim"], None),
    (mlp, ["model", "seq_len"], 4), (mlp, ["train", "optimizer", "betas"], [0.9, 0.9]),
    (layers, ["model", "input"], None), (layers, ["model", "seq_len"], None),
    (layers, ["model", "layers", 3], {"stage_boundary": {}, "type": "relu"}),
    (layers, ["model", "layers", 3], {"stage_boundary": {"x": 1}}),
    (layers, ["model", "layers", 5], {"type": "relu", "out": 3}),
    (layers, ["model", "layers", 6], {"type": "linear"}),
    (layers, ["model", "layers", 2], {"type": "conv"}),
    (feat, ["model", "input", "dim"], None), (feat, ["data", "kind"], "copy"),
    (feat, ["partition", "mode"], "even"),
    (bert, ["model", "tie_embeddings"], True), (bert, ["model", "bert_head"], "pooler"),
    (bert, ["model", "pad_token"], -1), (bert, ["data", "kind"], "copy"), (bert_cls, ["model", "n_labels"], 1),
    (bert, ["model", "rope_base"], 1e4), (bert_cls, ["data", "path"], None),
]
for base, path, value in broken:
    check("broken %s=%r" % (".".join(map(str, path)), value), patched(base, path, value), False)

n = len(examples) + len(specs) + len(broken)
print("%d checks, %d failed (%d example files)" % (n, fails, len(examples)))
sys.exit(1 if fails else 0)
EOF

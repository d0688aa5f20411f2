#!/usr/bin/env bash
# test_cli_train: `pipewright train|eval|inspect` as a user runs them.
#  - two runs of the same job give bit-identical loss lines;
#  - 3 steps + resume to 6 equals 6 straight steps, bit for bit;
#  - --steps 0 writes the initial parameters; eval reads a checkpoint;
#  - --init starts from a checkpoint's parameters at step 0 (fine-tuning),
#    refuses a checkpoint of another shape naming the tensor and both shapes;
#  - the loss of a short run falls;
#  - a broken spec is refused with its JSON path, nothing is written;
#  - a checkpoint with a flipped bit, or with non-finite weights (a diverged
#    run's), is refused by eval and --resume, naming the tensor.
set -euo pipefail
BUILD=$1; SRC=$2
PW="$BUILD/pipewright"
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
cd "$SRC"
fail() { echo "FAIL: $*" >&2; exit 1; }

cat > "$T/job.json" <<'J'
{"name": "cli-test",
 "model": {"template": "gpt", "vocab_size": 256, "seq_len": 16, "d_model": 32, "n_layers": 2, "n_heads": 2},
 "schedule": {"name": "1f1b", "microbatches": 2},
 "train": {"steps": 6, "batch_size": 4, "seed": 5, "grad_clip": 1.0,
           "optimizer": {"name": "adamw", "lr": 3e-3, "warmup_steps": 2}},
 "data": {"kind": "text", "path": "examples/data/corpus.txt", "sampler": "random"}}
J
"$PW" train --job "$T/job.json" --quiet --log-json "$T/a.jsonl" --out "$T/a.safetensors"
"$PW" train --job "$T/job.json" --quiet --log-json "$T/b.jsonl"
cut -d, -f1-4 "$T/a.jsonl" > "$T/a.losses"; cut -d, -f1-4 "$T/b.jsonl" > "$T/b.losses"
cmp -s "$T/a.losses" "$T/b.losses" || fail "two identical runs differ"
[ "$(wc -l < "$T/a.jsonl")" -eq 6 ] || fail "expected 6 log lines"

"$PW" train --job "$T/job.json" --quiet --steps 3 --out "$T/half.safetensors"
[ -f "$T/half.optim.safetensors" ] || fail "optimizer state not written alongside"
"$PW" train --job "$T/job.json" --quiet --resume "$T/half.safetensors" --log-json "$T/c.jsonl" --out "$T/c.safetensors"
tail -n 3 "$T/a.losses" > "$T/a.tail"; cut -d, -f1-4 "$T/c.jsonl" > "$T/c.losses"
cmp -s "$T/a.tail" "$T/c.losses" || { paste "$T/a.tail" "$T/c.losses"; fail "resume differs from a straight run"; }
cmp -s "$T/a.safetensors" "$T/c.safetensors" || fail "resumed final checkpoint differs from a straight run"

"$PW" train --job "$T/job.json" --quiet --steps 0 --out "$T/init.safetensors"
[ -s "$T/init.safetensors" ] || fail "--steps 0 wrote nothing"
cmp -s "$T/init.safetensors" "$T/a.safetensors" && fail "initial and trained parameters are equal"
"$PW" eval --job "$T/job.json" --checkpoint "$T/a.safetensors" | grep -Eq '^eval loss [0-9.]+' || fail "eval printed no loss"

# --init: the parameters of a, step 0, a fresh optimizer.
"$PW" train --job "$T/job.json" --quiet --init "$T/a.safetensors" --steps 0 --out "$T/i0.safetensors"
ea=$("$PW" eval --job "$T/job.json" --checkpoint "$T/a.safetensors")
ei=$("$PW" eval --job "$T/job.json" --checkpoint "$T/i0.safetensors")
[ "$ea" = "$ei" ] || fail "--init did not load a's parameters ($ea vs $ei)"
"$PW" train --job "$T/job.json" --quiet --init "$T/a.safetensors" --steps 2 --log-json "$T/ft.jsonl"
[ "$(head -1 "$T/ft.jsonl" | sed 's/.*"step": \([0-9]*\).*/\1/')" = 0 ] || fail "--init did not start at step 0"
f0=$(head -1 "$T/ft.jsonl" | sed 's/.*"loss": \([0-9.e+-]*\).*/\1/')
a0=$(head -1 "$T/a.jsonl" | sed 's/.*"loss": \([0-9.e+-]*\).*/\1/')
awk -v f="$f0" -v a="$a0" 'BEGIN { exit !(f < a - 0.3) }' || fail "fine-tuning starts no lower than scratch ($f0 vs $a0)"
sed 's/"d_model": 32/"d_model": 48/' "$T/job.json" > "$T/wide.json"
if "$PW" train --job "$T/wide.json" --quiet --init "$T/a.safetensors" --steps 1 2> "$T/err"; then
  fail "--init accepted a checkpoint of another shape"
fi
grep -q "tensor '.*': shape is \[.*\], expected \[.*\]" "$T/err" || { cat "$T/err"; fail "--init: no shape error"; }
if "$PW" train --job "$T/job.json" --init "$T/a.safetensors" --resume "$T/a.safetensors" 2> "$T/err"; then
  fail "--init with --resume accepted"
fi

first=$(head -1 "$T/a.jsonl" | sed 's/.*"loss": \([0-9.e+-]*\).*/\1/')
last=$(tail -1 "$T/a.jsonl" | sed 's/.*"loss": \([0-9.e+-]*\).*/\1/')
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.3) }' || fail "loss did not fall ($first -> $last)"

"$PW" inspect --job examples/jobs/gpt-tiny.json | grep -q 'blocks.3' || fail "inspect shows no blocks.3"

sed 's/"n_heads": 2/"n_heads": 5/' "$T/job.json" > "$T/bad.json"
if "$PW" train --job "$T/bad.json" --out "$T/bad.safetensors" 2> "$T/err"; then fail "broken spec accepted"; fi
grep -q 'model.n_heads: must divide d_model (32 % 5 != 0)' "$T/err" || { cat "$T/err"; fail "unclear error"; }
[ ! -e "$T/bad.safetensors" ] || fail "a refused job wrote a checkpoint"

# A bit flipped in a tensor's bytes: the last byte of the file is data.
cp "$T/a.safetensors" "$T/flip.safetensors"
python3 -c 'import sys; p = sys.argv[1]; b = bytearray(open(p, "rb").read()); b[-1] ^= 4; open(p, "wb").write(b)' \
  "$T/flip.safetensors"
if "$PW" eval --job "$T/job.json" --checkpoint "$T/flip.safetensors" 2> "$T/err"; then fail "a flipped bit was accepted"; fi
grep -q "checksum mismatch" "$T/err" || { cat "$T/err"; fail "no checksum error"; }
# A diverged run (lr 1e30) writes NaN weights; nothing loads them.
sed 's/"lr": 3e-3/"lr": 1e30/' "$T/job.json" > "$T/div.json"
"$PW" train --job "$T/div.json" --quiet --steps 3 --out "$T/div.safetensors" || true
[ -f "$T/div.safetensors" ] || fail "the diverged run wrote no checkpoint to refuse"
if "$PW" eval --job "$T/job.json" --checkpoint "$T/div.safetensors" 2> "$T/err"; then fail "NaN weights were loaded"; fi
grep -q "holds a non-finite value" "$T/err" || { cat "$T/err"; fail "no non-finite error"; }
if "$PW" train --job "$T/job.json" --quiet --resume "$T/div.safetensors" --steps 4 2> "$T/err"; then
  fail "a run resumed from NaN weights"
fi
grep -q "holds a non-finite value" "$T/err" || { cat "$T/err"; fail "resume: no non-finite error"; }
echo "1 passed, 0 failed"

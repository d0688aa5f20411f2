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
#    run's), is refused by eval and --resume, naming the tensor;
#  - bad command lines are named, with exit 2 and nothing trained: numbers
#    that are not whole or out of range, a missing --job, unknown options
#    (with "did you mean"); a field typo in the spec gets "did you mean";
#  - per-step lines count steps done ("step N/M"), as watch and the API do;
#  - --resume without --out warns that nothing will be saved;
#  - a diverged run (lr 1e6) fails as the cluster's does: exit 1, "diverged
#    at step N", no checkpoint; with train.on_nonfinite "skip" it goes on,
#    says which steps it skipped, and its checkpoint is finite (eval loads it);
#  - examples/jobs/bert-tiny.json (template bert, masked LM): its loss falls
#    from about ln 257 and its held-out loss with it.
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
# NaN weights (what a diverged run would have saved; pipewright train no
# longer writes them, below): one element of a tensor made NaN, its checksum
# dropped (st.py, tests/ref: an independent writer). Nothing loads them.
/usr/bin/python3 - "$T/a.safetensors" "$T/nan.safetensors" <<'PY' || fail "could not make a NaN checkpoint"
import sys
sys.path.insert(0, "tests/ref")
import st
tensors, meta = st.load(sys.argv[1])
name = sorted(n for n in tensors if n.endswith(".weight"))[0]
t = tensors[name].copy()
t.flat[1] = float("nan")
tensors[name] = t
st.save(sys.argv[2], tensors, {k: v for k, v in meta.items() if k != "pw.crc32c." + name})
PY
if "$PW" eval --job "$T/job.json" --checkpoint "$T/nan.safetensors" 2> "$T/err"; then fail "NaN weights were loaded"; fi
grep -q "holds a non-finite value" "$T/err" || { cat "$T/err"; fail "no non-finite error"; }
if "$PW" train --job "$T/job.json" --quiet --resume "$T/nan.safetensors" --steps 4 2> "$T/err"; then
  fail "a run resumed from NaN weights"
fi
grep -q "holds a non-finite value" "$T/err" || { cat "$T/err"; fail "resume: no non-finite error"; }
# Bad command lines: the message names the flag and the value, exit 2, no training.
expect_usage() { # "message" args...
  local want=$1 rc=0; shift
  "$PW" "$@" > "$T/out" 2> "$T/err" || rc=$?
  [ $rc -eq 2 ] || { cat "$T/err"; fail "pipewright $*: exit $rc, want 2"; }
  grep -qxF "$want" "$T/err" || { cat "$T/err"; fail "pipewright $*: no '$want'"; }
  grep -q '^usage: ' "$T/err" || fail "pipewright $*: no usage after the message"
  [ ! -s "$T/out" ] || { cat "$T/out"; fail "pipewright $*: printed to stdout (trained?)"; }
}
J=(--job "$T/job.json")
expect_usage "pipewright train: --steps: 'abc' is not a whole number" train "${J[@]}" --steps abc
expect_usage "pipewright train: --steps: '3x' is not a whole number" train "${J[@]}" --steps 3x
expect_usage "pipewright train: --steps: '' is not a whole number" train "${J[@]}" --steps ''
expect_usage "pipewright train: --steps: ' 3' is not a whole number" train "${J[@]}" --steps ' 3'
expect_usage "pipewright train: --steps: '-1' is negative (want 0 or more)" train "${J[@]}" --steps -1
expect_usage "pipewright train: --steps: '99999999999999999999' is too large (at most 2147483647)" \
  train "${J[@]}" --steps 99999999999999999999
expect_usage "pipewright train: --steps: '4294967297' is too large (at most 2147483647)" train "${J[@]}" --steps 4294967297
expect_usage "pipewright train: --threads: '0' is too small (want 1 to 4096)" train "${J[@]}" --threads 0
expect_usage "pipewright train: --threads: '2.5' is not a whole number" train "${J[@]}" --threads 2.5
expect_usage "pipewright train: missing --job FILE" train --steps 3
expect_usage "pipewright train: --job needs a value" train --job
expect_usage "pipewright train: unknown option '--step'; did you mean --steps?" train "${J[@]}" --step 3
expect_usage "pipewright train: unknown option '--stpes'; did you mean --steps?" train "${J[@]}" --stpes 3
expect_usage "pipewright train: unknown option '--verbose'" train "${J[@]}" --verbose
expect_usage "pipewright train: --quiet takes no value" train "${J[@]}" --quiet=yes
expect_usage "pipewright train: unexpected argument 'extra'" train "${J[@]}" extra
expect_usage "pipewright train: --resume and --init exclude each other" train "${J[@]}" --init a --resume b
expect_usage "pipewright eval: missing --checkpoint CKPT" eval "${J[@]}"
expect_usage "pipewright eval: --threads: 'many' is not a whole number" eval "${J[@]}" --checkpoint x --threads many
expect_usage "pipewright inspect: missing --job FILE" inspect
expect_usage "pipewright inspect: unknown option '--node'; did you mean --nodes?" inspect "${J[@]}" --node

# A field typo in the spec: the path, and the field it probably meant.
sed 's/"n_heads": 2/"n_head": 2/' "$T/job.json" > "$T/typo.json"
if "$PW" train --job "$T/typo.json" 2> "$T/err"; then fail "a misspelt field was accepted"; fi
grep -qx "error: $T/typo.json: model.n_head: unknown field; did you mean n_heads?" "$T/err" || { cat "$T/err"; fail "no did-you-mean for a field"; }

# One step numbering: "step N/M" after the Nth step, as watch and status say it.
"$PW" train --job "$T/job.json" --steps 3 > "$T/lines.txt"
[ "$(sed -n 's#^step \([0-9]*\)/3  loss .*#\1#p' "$T/lines.txt" | tr '\n' ' ')" = "1 2 3 " ] || { cat "$T/lines.txt"; fail "step lines are not 1/3 2/3 3/3"; }
"$PW" train --job "$T/job.json" --resume "$T/half.safetensors" --steps 5 > "$T/lines.txt" 2> "$T/err"
grep -q 'resumed after step 3$' "$T/lines.txt" || { cat "$T/lines.txt"; fail "no 'resumed after step 3'"; }
[ "$(sed -n 's#^step \([0-9]*\)/5  loss .*#\1#p' "$T/lines.txt" | tr '\n' ' ')" = "4 5 " ] || { cat "$T/lines.txt"; fail "resumed step lines are not 4/5 5/5"; }
# ... and --resume without --out says that the result is thrown away
grep -qx "warning: --resume without --out: the trained parameters will not be saved" "$T/err" || { cat "$T/err"; fail "no --resume warning"; }
"$PW" train --job "$T/job.json" --quiet --resume "$T/half.safetensors" --steps 4 --out "$T/r4.safetensors" 2> "$T/err"
[ ! -s "$T/err" ] || { cat "$T/err"; fail "--resume with --out warned"; }

# A diverged run fails (the cluster fails the job "diverged at step N"); nothing is written.
sed 's/"lr": 3e-3/"lr": 1e6/; s/"grad_clip": 1.0/"grad_clip": 0/' "$T/job.json" > "$T/div.json"
grep -q '"lr": 1e6' "$T/div.json" || fail "div.json was not made"
rc=0; "$PW" train --job "$T/div.json" --out "$T/div.safetensors" > "$T/lines.txt" 2> "$T/err" || rc=$?
[ "$rc" = 1 ] || { cat "$T/lines.txt" "$T/err"; fail "a diverged run exited $rc, not 1"; }
grep -qE '^error: diverged at step [0-9]+: the (loss|gradient norm|loss and the gradient norm) (is|are) not finite; the final checkpoint is not written' "$T/err" ||
  { cat "$T/err"; fail "no 'diverged at step N' message"; }
[ ! -e "$T/div.safetensors" ] || fail "a diverged run wrote its checkpoint"
# ... and with train.on_nonfinite "skip" it goes on, skipping those updates; its weights stay finite
sed 's/"warmup_steps": 2}/"warmup_steps": 2}, "on_nonfinite": "skip"/' "$T/div.json" > "$T/skip.json"
grep -q '"on_nonfinite": "skip"' "$T/skip.json" || fail "skip.json was not made"
"$PW" train --job "$T/skip.json" --out "$T/skip.safetensors" > "$T/lines.txt" 2> "$T/err" ||
  { cat "$T/err"; fail "on_nonfinite skip: the run failed"; }
grep -qE '^warning: step [0-9]+ skipped: .* not finite \(train.on_nonfinite: skip\)$' "$T/err" || { cat "$T/err"; fail "no skipped step said"; }
"$PW" eval --job "$T/skip.json" --checkpoint "$T/skip.safetensors" > /dev/null 2> "$T/err" ||
  { cat "$T/err"; fail "on_nonfinite skip: its checkpoint does not load (non-finite weights?)"; }

# BERT's masked LM trains: the loss over the masked positions falls from ln 257 (5.55), and eval's with it
"$PW" train --job examples/jobs/bert-tiny.json --steps 20 --quiet --log-json "$T/bert.jsonl" --out "$T/bert.safetensors"
python3 - "$T/bert.jsonl" <<'P' || fail "bert-tiny: the masked-LM loss did not fall"
import json, sys
l = [json.loads(x)["loss"] for x in open(sys.argv[1])]
assert len(l) == 20 and abs(l[0] - 5.55) < 0.2 and max(l[-5:]) < l[0] - 1.5, l
P
"$PW" eval --job examples/jobs/bert-tiny.json --checkpoint "$T/bert.safetensors" |
  awk '/^eval loss/ { exit !($3 < 4.0) } END { if (NR == 0) exit 1 }' || fail "bert-tiny: eval loss not below 4"
echo "1 passed, 0 failed"

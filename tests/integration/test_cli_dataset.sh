#!/usr/bin/env bash
# test_cli_dataset: `pipewright dataset upload | list | rm | convert | check`
# and submit's data.path -> dataset fallback.
#   1. convert and check on local files: a text converted to a token file
#      checks with n_tokens == bytes and ids == bytes (read back here),
#      wrong files are refused with what is wrong;
#   2. against cli_remote_servers.py's "datasets" server, which implements
#      the contract's routes and logs every upload (length, sha256, headers)
#      and every job it receives: uploads are streamed with the right bytes
#      (the stored copy equals the file; a 256 MiB upload keeps the CLI's
#      RSS far below the file), stored once, listed, removed (refused while
#      a queued job uses them); submit resolves data.path against the job
#      file's folder and, refused at data.path, uploads and resubmits with
#      data.dataset; a refused token costs no body;
#   3. the same against the real coordinator (--data-root, no workers: jobs
#      stay queued) when its POST /v1/datasets answers; skipped, said so,
#      when that route is not there yet (404).
# Every process started here is killed on exit.
set -uo pipefail
BUILD=$(cd "$1" && pwd); SRC=$(cd "$2" && pwd)
PW="$BUILD/pipewright"
[ -x "$PW" ] || { echo "FAIL: no $PW"; echo "0 passed, 1 failed"; exit 1; }
T=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${PIDS[@]}"; do
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null
  done
  wait 2>/dev/null
  [ -n "${PW_KEEP_TMP:-}" ] && echo "kept $T" || rm -rf "$T"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
unset http_proxy https_proxy HTTPS_PROXY all_proxy ALL_PROXY no_proxy NO_PROXY PIPEWRIGHT_TOKEN_FILE

passed=0; failed=0
ok() { passed=$((passed + 1)); echo "ok: $*"; }
bad() { failed=$((failed + 1)); echo "FAIL: $*"; }
show() { sed 's/^/    | /' "$@"; }
sha() { sha256sum "$1" | cut -c1-64; }
WAIT=${PW_TEST_WAIT:-60}

# ---- 1. convert and check ------------------------------------------------------------
mkdir -p "$T/jobs/data" "$T/root" "$T/elsewhere"
python3 -c 'import sys; sys.stdout.buffer.write(bytes(range(256)) * 40 + b"the end\n")' > "$T/all.txt"
if "$PW" dataset convert "$T/all.txt" "$T/all.tok" > "$T/conv.txt" 2>&1 &&
  grep -qx "$T/all.tok: 10248 tokens, vocab 256, 2-byte ids (byte-level, from $T/all.txt)" "$T/conv.txt"; then
  ok "convert: a text of 10248 bytes -> 10248 tokens"
else
  bad "convert"; show "$T/conv.txt"
fi
if python3 - "$T/all.txt" "$T/all.tok" <<'P'; then ok "the token file: header as the contract says, ids == bytes"; else bad "token file layout"; fi
import struct, sys
text = open(sys.argv[1], "rb").read()
tok = open(sys.argv[2], "rb").read()
magic, version, width, vocab, reserved, n = struct.unpack("<8sIIIIQ", tok[:32])
assert (magic, version, width, vocab, reserved, n) == (b"PWTOKENS", 1, 2, 256, 0, len(text)), (magic, version, width, vocab, n)
assert len(tok) == 32 + 2 * n
assert list(struct.unpack("<%dH" % n, tok[32:])) == list(text)
P
"$PW" dataset check "$T/all.tok" > "$T/check1.txt" 2>&1
rc=$?
if [ $rc -eq 0 ] && grep -qx "$T/all.tok: tokens: version 1, 10248 ids of 2 bytes, vocab 256: header and ids valid" "$T/check1.txt"; then
  ok "check: the converted file is valid, n_tokens == bytes"
else
  bad "check of the converted file: exit $rc"; show "$T/check1.txt"
fi
"$PW" dataset check "$T/all.txt" > "$T/check2.txt" 2>&1
rc=$?
if [ $rc -eq 0 ] && grep -qx "$T/all.txt: text (byte-level): 10248 bytes (10.25K), each byte one token of vocab 256" "$T/check2.txt"; then
  ok "check: a text file is reported as text"
else
  bad "check of a text: exit $rc"; show "$T/check2.txt"
fi
# broken token files: each refused (exit 1) with what is wrong
python3 - "$T" <<'P'
import struct, sys
d = sys.argv[1]
good = open(d + "/all.tok", "rb").read()
def put(name, b): open("%s/%s.tok" % (d, name), "wb").write(b)
put("badid", good[:32] + struct.pack("<H", 300) + good[34:])           # id 0 is 300 >= 256
put("short", good[:-1])                                                 # one byte missing
put("version", good[:8] + struct.pack("<I", 9) + good[12:])             # version 9
put("width", good[:12] + struct.pack("<I", 3) + good[16:])               # width 3
put("vocab", good[:16] + struct.pack("<I", 70000) + good[20:])           # > 65536 with width 2
put("header", good[:20])                                                # a header cut short
P
for c in "badid|300" "short|" "version|version" "width|width" "vocab|vocab" "header|"; do
  f=${c%%|*}; word=${c#*|}
  "$PW" dataset check "$T/$f.tok" > "$T/check-$f.txt" 2>&1
  rc=$?
  if [ $rc -eq 1 ] && grep -q "^error: $T/$f.tok: .*$word" "$T/check-$f.txt"; then
    ok "check refuses a token file with a bad $f: $(head -1 "$T/check-$f.txt" | sed "s#^error: $T/##")"
  else
    bad "check of $f.tok: exit $rc"; show "$T/check-$f.txt"
  fi
done
"$PW" dataset convert "$T/all.tok" "$T/again.tok" > "$T/conv2.txt" 2>&1
rc=$?
if [ $rc -eq 1 ] && grep -q "^error: $T/all.tok: already a token file" "$T/conv2.txt" && [ ! -e "$T/again.tok" ]; then
  ok "convert refuses a file that is already tokens"
else
  bad "convert of a token file: exit $rc"; show "$T/conv2.txt"
fi
"$PW" dataset check "$T/nothing" > "$T/check3.txt" 2>&1
rc=$?
if [ $rc -eq 1 ] && grep -q "^error: $T/nothing: " "$T/check3.txt"; then ok "check of a missing file"; else
  bad "check of a missing file: exit $rc"; show "$T/check3.txt"; fi
"$PW" dataset frobnicate > "$T/usage.txt" 2>&1
rc=$?
if [ $rc -eq 2 ] && grep -q "unknown command 'frobnicate'" "$T/usage.txt" && grep -q '^  upload FILE' "$T/usage.txt"; then
  ok "an unknown dataset command: usage, exit 2"
else
  bad "unknown dataset command: exit $rc"; show "$T/usage.txt"
fi

# ---- the files and jobs the remote parts use -----------------------------------------
head -c 300000 /dev/urandom > "$T/a.bin"
cp "$SRC/examples/data/corpus.txt" "$T/jobs/data/c.txt"
printf 'a text under the data root\n%.0s' $(seq 200) > "$T/root/in.txt"
# the same tiny job as test_cli_remote.sh, its data.path given per case
job() { # FILE DATA-PATH
  cat > "$1" <<EOF
{"name": "cli-dataset",
 "model": {"template": "gpt", "vocab_size": 256, "seq_len": 16, "d_model": 32, "n_layers": 2, "n_heads": 4},
 "mesh": {"pp": 2, "dp": 1, "virtual_stages": 1},
 "schedule": {"name": "1f1b", "microbatches": 2},
 "train": {"steps": 10, "batch_size": 4, "seed": 1, "optimizer": {"name": "adamw", "lr": 0.003}},
 "data": {"kind": "text", "path": "$2", "sampler": "random"}}
EOF
}
job "$T/jobs/rel.json" data/c.txt          # relative to the job file's folder
job "$T/jobs/inroot.json" "$T/root/in.txt"
job "$T/jobs/missing.json" data/none.txt

start_helper() { # NAME [options...]: sets PORT
  local name=$1 i; shift
  python3 "$SRC/tests/integration/cli_remote_servers.py" "$@" --ready "$T/$name.port" --log "$T/$name.log" \
    --lifetime $((WAIT * 20)) > "$T/$name.out" 2>&1 &
  PIDS+=($!)
  local pid=$!
  touch "$T/$name.log"
  PORT=
  for i in $(seq $((WAIT * 10))); do
    [ -s "$T/$name.port" ] && { PORT=$(cat "$T/$name.port"); return 0; }
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  echo "$name did not start:"; show "$T/$name.out"
  return 1
}

# suite LABEL URL LOG: the checks both servers must pass; LOG is the fake's
# request log ("" for the real coordinator: the checks that read it are skipped).
suite() {
  local L=$1 R=(--coordinator "$2") LOG=$3 A B S n0 id
  A=$(sha "$T/a.bin")
  "$PW" dataset upload "$T/a.bin" --name first "${R[@]}" > "$T/$L-up1.txt" 2>&1
  rc=$?
  if [ $rc -eq 0 ] && grep -qx "dataset $A uploaded: 300000 bytes (300.00K), text" "$T/$L-up1.txt"; then
    ok "$L: upload prints id, size, format, 'uploaded'"
  else
    bad "$L: upload: exit $rc"; show "$T/$L-up1.txt"
  fi
  if [ -n "$LOG" ]; then
    if grep -qx "upload name=first length=300000 sha256=$A new=1 type=application/octet-stream expect=100-continue" "$LOG" &&
      cmp -s "$T/a.bin" "$T/$L-store/$A"; then
      ok "$L: the upload arrived with Content-Length, 100-continue, octet-stream; the stored bytes equal the file"
    else
      bad "$L: the upload as the server saw it"; show "$LOG"
    fi
  fi
  n0=$(grep -c '^upload ' "$LOG" 2>/dev/null)
  "$PW" dataset upload "$T/a.bin" "${R[@]}" > "$T/$L-up2.txt" 2>&1
  rc=$?
  if [ $rc -eq 0 ] && grep -qx "dataset $A already stored: 300000 bytes (300.00K), text" "$T/$L-up2.txt" &&
    [ "$(grep -c '^upload ' "$LOG" 2>/dev/null)" = "$n0" ]; then
    ok "$L: the same bytes again: 'already stored', nothing sent"
  else
    bad "$L: second upload: exit $rc"; show "$T/$L-up2.txt"
  fi
  B=$(sha "$T/all.tok")
  id=$("$PW" dataset upload "$T/all.tok" --quiet "${R[@]}" 2> "$T/$L-up3.err")
  "$PW" dataset list "${R[@]}" > "$T/$L-list.txt" 2>&1
  if [ "$id" = "$B" ] && grep -Eq '^ID +NAME +FORMAT +SIZE +TOKENS +VOCAB +CREATED$' "$T/$L-list.txt" &&
    grep -Eq "^${A:0:12} +first +text +300.00K +- +- " "$T/$L-list.txt" &&
    grep -Eq "^${B:0:12} +all.tok +tokens +20.53K +10.25K +256 " "$T/$L-list.txt"; then
    ok "$L: upload --quiet prints the id; list shows both (name, format, size, tokens, vocab)"
  else
    bad "$L: upload --quiet / list"; echo "    id=$id"; show "$T/$L-up3.err" "$T/$L-list.txt"
  fi
  "$PW" dataset list --json "${R[@]}" > "$T/$L-list.json" 2>&1
  if python3 - "$T/$L-list.json" "$A" "$B" <<'P'; then ok "$L: list --json: the contract's dataset objects"; else bad "$L: list --json"; show "$T/$L-list.json"; fi
import json, sys
ds = {d["id"]: d for d in json.load(open(sys.argv[1]))["datasets"]}
a, b = ds[sys.argv[2]], ds[sys.argv[3]]
assert a["sha256"] == a["id"] and a["size"] == 300000 and a["format"] == "text", a
assert (b["format"], b["vocab_size"], b["width"], b["n_tokens"], b["size"]) == ("tokens", 256, 2, 10248, 32 + 2 * 10248), b
P
  # a wrong token header: refused here, nothing sent
  n0=$(grep -c '^upload ' "$LOG" 2>/dev/null)
  "$PW" dataset upload "$T/version.tok" "${R[@]}" > "$T/$L-up4.txt" 2>&1
  rc=$?
  if [ $rc -eq 1 ] && grep -q "^error: $T/version.tok: .*version" "$T/$L-up4.txt" &&
    [ "$(grep -c '^upload ' "$LOG" 2>/dev/null)" = "$n0" ]; then
    ok "$L: a token file with a wrong header is refused before upload"
  else
    bad "$L: bad header upload: exit $rc"; show "$T/$L-up4.txt"
  fi

  # ---- submit: data.path relative to the job file, outside any data root
  S=$(sha "$T/jobs/data/c.txt")
  (cd "$T/elsewhere" && "$PW" submit --job ../jobs/rel.json "${R[@]}") > "$T/$L-sub1.txt" 2>&1
  rc=$?
  if [ $rc -eq 0 ] && grep -qx "data.path $T/jobs/data/c.txt: uploaded as dataset $S: .*, text" "$T/$L-sub1.txt" &&
    grep -Eq '^job [0-9]+ queued$' "$T/$L-sub1.txt"; then
    ok "$L: submit with a data.path the coordinator refuses: uploaded, resubmitted as data.dataset, said so"
  else
    bad "$L: submit fallback: exit $rc"; show "$T/$L-sub1.txt"
  fi
  JOB1=$(sed -n 's/^job \([0-9]*\) queued$/\1/p' "$T/$L-sub1.txt")
  if [ -n "$LOG" ]; then
    if python3 - "$LOG" "$T/jobs/data/c.txt" "$S" <<'P'; then ok "$L: sent first with the path made absolute, then with data.dataset and no path"; else bad "$L: the jobs the server got"; show "$LOG"; fi
import json, sys
jobs = [json.loads(l[4:]) for l in open(sys.argv[1]) if l.startswith("job ")]
assert jobs[-2]["data"] == {"kind": "text", "path": sys.argv[2], "sampler": "random"}, jobs[-2]
assert jobs[-1]["data"] == {"kind": "text", "dataset": sys.argv[3], "sampler": "random"}, jobs[-1]
assert jobs[-1]["model"] == jobs[-2]["model"] and jobs[-1]["train"] == jobs[-2]["train"]
P
  fi
  JOB2=$("$PW" submit --job "$T/jobs/rel.json" --quiet "${R[@]}" 2> "$T/$L-sub2.err")
  if [[ "$JOB2" =~ ^[0-9]+$ ]] && grep -qx "data.path $T/jobs/data/c.txt: already stored as dataset $S: .*" "$T/$L-sub2.err"; then
    ok "$L: submit --quiet: only the id on stdout, 'already stored' on stderr"
  else
    bad "$L: submit --quiet: '$JOB2'"; show "$T/$L-sub2.err"
  fi
  # a path under the data root: the coordinator takes it as it is
  "$PW" submit --job "$T/jobs/inroot.json" "${R[@]}" > "$T/$L-sub3.txt" 2>&1
  rc=$?
  if [ $rc -eq 0 ] && grep -Eq '^job [0-9]+ queued$' "$T/$L-sub3.txt" && ! grep -q 'dataset' "$T/$L-sub3.txt"; then
    ok "$L: submit with a path under --data-root: accepted, nothing uploaded"
  else
    bad "$L: submit in root: exit $rc"; show "$T/$L-sub3.txt"
  fi
  # a path that exists nowhere: the coordinator's error, and why no upload
  "$PW" submit --job "$T/jobs/missing.json" "${R[@]}" > "$T/$L-sub4.txt" 2>&1
  rc=$?
  if [ $rc -eq 1 ] && grep -q '^error: data.path: ' "$T/$L-sub4.txt" &&
    grep -q "^error: $T/jobs/data/none.txt: no such file or directory here either" "$T/$L-sub4.txt"; then
    ok "$L: submit with a missing file: refused, said why nothing was uploaded"
  else
    bad "$L: submit missing: exit $rc"; show "$T/$L-sub4.txt"
  fi

  # ---- rm: refused while a queued job uses it; by a prefix once cancelled
  "$PW" dataset rm "$S" "${R[@]}" > "$T/$L-rm1.txt" 2>&1
  rc=$?
  if [ $rc -eq 1 ] && grep -q '^error: ' "$T/$L-rm1.txt"; then ok "$L: rm of a dataset a queued job uses: refused"; else
    bad "$L: rm in use: exit $rc"; show "$T/$L-rm1.txt"; fi
  "$PW" cancel "$JOB1" "${R[@]}" > /dev/null 2>&1
  "$PW" cancel "$JOB2" "${R[@]}" > /dev/null 2>&1
  "$PW" dataset rm "${S:0:10}" "${R[@]}" > "$T/$L-rm2.txt" 2>&1
  rc=$?
  if [ $rc -eq 0 ] && grep -qx "dataset $S removed" "$T/$L-rm2.txt" &&
    ! "$PW" dataset list --no-trunc "${R[@]}" | grep -q "^$S "; then
    ok "$L: rm by a prefix once the jobs are cancelled; gone from the list"
  else
    bad "$L: rm: exit $rc"; show "$T/$L-rm2.txt"
  fi
  "$PW" dataset rm 0000000 "${R[@]}" > "$T/$L-rm3.txt" 2>&1
  rc=$?
  if [ $rc -eq 1 ] && grep -qx "error: no dataset 0000000... on the coordinator" "$T/$L-rm3.txt"; then
    ok "$L: rm of an unknown prefix"
  else
    bad "$L: rm unknown: exit $rc"; show "$T/$L-rm3.txt"
  fi
  "$PW" dataset rm "$(printf '%064d' 0)" "${R[@]}" > "$T/$L-rm4.txt" 2>&1
  rc=$?
  if [ $rc -eq 1 ] && grep -q '^error: ' "$T/$L-rm4.txt"; then ok "$L: rm of an unknown id: the coordinator's 404"; else
    bad "$L: rm unknown id: exit $rc"; show "$T/$L-rm4.txt"; fi
}

# ---- 2. the contract's routes in cli_remote_servers.py ------------------------------------
mkdir -p "$T/fake-store"
if start_helper fake datasets --store "$T/fake-store" --data-root "$T/root"; then
  suite fake "http://127.0.0.1:$PORT" "$T/fake.log"
  F=(--coordinator "http://127.0.0.1:$PORT")
  # a large upload is streamed: the CLI's peak RSS stays far below the file
  truncate -s 256M "$T/big.bin"
  python3 - "$T/rss.txt" "$PW" dataset upload "$T/big.bin" "${F[@]}" > "$T/big.txt" 2>&1 <<'P'
import resource, subprocess, sys
rc = subprocess.call(sys.argv[2:])
open(sys.argv[1], "w").write("%d\n" % resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
sys.exit(rc)
P
  rc=$?
  BIG=$(sha "$T/big.bin"); RSS=$(cat "$T/rss.txt" 2>/dev/null || echo 0)
  if [ $rc -eq 0 ] && grep -qx "dataset $BIG uploaded: 268435456 bytes (268.44M), text" "$T/big.txt" &&
    grep -q "^upload name=big.bin length=268435456 sha256=$BIG " "$T/fake.log" && [ "$RSS" -lt 65536 ]; then
    ok "fake: a 256 MiB upload is streamed: stored with the right hash, the CLI's peak RSS $((RSS / 1024)) MiB"
  else
    bad "fake: 256 MiB upload: exit $rc, peak RSS ${RSS} KiB"; show "$T/big.txt"
  fi
  rm -f "$T/big.bin" "$T/fake-store/$BIG"
else
  bad "datasets server start"
fi
# a token-protected server with an upload bound: refusals store nothing,
# and an upload refused for its size gets the answer before its body
printf 'ds-token-%s\n' "$RANDOM$RANDOM" > "$T/token"; printf 'wrong\n' > "$T/wrong"
chmod 600 "$T/token" "$T/wrong"
mkdir -p "$T/tok-store"
if start_helper tok datasets --store "$T/tok-store" --token "$T/token" --max-upload 8000000; then
  K=(--coordinator "http://127.0.0.1:$PORT")
  head -c 5000000 /dev/urandom > "$T/five.bin"
  "$PW" dataset upload "$T/five.bin" "${K[@]}" --token-file "$T/wrong" > "$T/tok1.txt" 2>&1
  rc=$?
  if [ $rc -eq 1 ] && grep -q '^hint: the coordinator refused the token given' "$T/tok1.txt" &&
    [ -z "$(ls "$T/tok-store")" ]; then
    ok "tok: a wrong token: refused with a hint, nothing stored"
  else
    bad "tok: wrong token: exit $rc"; show "$T/tok1.txt" "$T/tok.log"
  fi
  "$PW" dataset upload "$T/five.bin" "${K[@]}" --token-file "$T/token" > "$T/tok2.txt" 2>&1
  rc=$?
  if [ $rc -eq 0 ] && grep -q "^dataset $(sha "$T/five.bin") uploaded: 5000000 bytes" "$T/tok2.txt" &&
    cmp -s "$T/five.bin" "$T/tok-store/$(sha "$T/five.bin")"; then
    ok "tok: with the token: uploaded, the bytes stored equal the file"
  else
    bad "tok: with the token: exit $rc"; show "$T/tok2.txt" "$T/tok.log"
  fi
  head -c 9000000 /dev/urandom > "$T/nine.bin"
  "$PW" dataset upload "$T/nine.bin" "${K[@]}" --token-file "$T/token" > "$T/tok3.txt" 2>&1
  rc=$?
  if [ $rc -eq 1 ] && grep -qx 'error: 9000000 bytes: over this server.s bound of 8000000' "$T/tok3.txt" &&
    grep -qx 'POST /v1/datasets refused: too large (expect=100-continue)' "$T/tok.log" &&
    [ "$(ls "$T/tok-store" | wc -l)" = 2 ]; then
    ok "tok: an upload over the server's bound: its 413 before the body (100-continue), nothing stored"
  else
    bad "tok: 413: exit $rc"; show "$T/tok3.txt" "$T/tok.log"
  fi
else
  bad "token-protected datasets server start"
fi

# ---- 3. the real coordinator, once it has the routes -----------------------------------
COORD="$BUILD/pipewright-coordinator"
mkdir -p "$T/coord"
if [ -x "$COORD" ]; then
  "$COORD" --http 127.0.0.1:0 --control 127.0.0.1:0 --state-dir "$T/coord" --data-root "$T/root" \
    --ready-file "$T/coord/ready.json" > "$T/coord/log" 2>&1 &
  PIDS+=($!)
  HTTP=
  for _ in $(seq $((WAIT * 10))); do
    [ -s "$T/coord/ready.json" ] && HTTP=$(sed -n 's/.*"http" *: *\([0-9][0-9]*\).*/\1/p' "$T/coord/ready.json")
    [ -n "$HTTP" ] && break
    kill -0 "${PIDS[-1]}" 2>/dev/null || break
    sleep 0.1
  done
  if [ -z "$HTTP" ]; then
    # an older coordinator without --data-root exits at once: it has no datasets either
    if grep -q 'data-root' "$T/coord/log"; then
      echo "SKIP real coordinator part: it does not know --data-root yet"
    else
      bad "real coordinator start"; show "$T/coord/log"
    fi
  else
    printf 'probe\n' > "$T/probe.txt"
    code=$(curl -s -o "$T/probe.out" -w '%{http_code}' --data-binary @"$T/probe.txt" \
      -H 'Content-Type: application/octet-stream' "http://127.0.0.1:$HTTP/v1/datasets")
    if [ "$code" = 404 ] || [ "$code" = 405 ]; then
      echo "SKIP real coordinator part: POST /v1/datasets answers $code (no dataset routes yet)"
    else
      suite real "http://127.0.0.1:$HTTP" ""
    fi
  fi
else
  echo "SKIP real coordinator part: no $COORD"
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]

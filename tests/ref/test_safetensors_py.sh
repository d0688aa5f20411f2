#!/usr/bin/env bash
# test_safetensors_py: pipewright's safetensors files against an independent
# Python reader and writer (struct + json + numpy, no safetensors package).
#  1. C writes the sample; Python parses it by the spec and checks the layout
#     (LE length, space padding to 8, name order, packed offsets), values and
#     each tensor's CRC32C in the metadata (computed here from its definition).
#  2. Python writes the same sample its own way (unpadded header, reversed
#     key order, tensors in another order with gaps, so data is unaligned);
#     C must read it back exactly.
# Args: BUILD_DIR SOURCE_DIR. Exit 77 (skip) without numpy.
set -euo pipefail
build="$1"
py=/usr/bin/python3
[ -x "$py" ] || py=python3
"$py" -c 'import numpy' 2>/dev/null || { echo "SKIP test_safetensors_py: python3-numpy is missing"; exit 77; }
bin="$build/tests/test_safetensors"
[ -x "$bin" ] || bin="$(find "$build" -name test_safetensors -type f -perm -u+x | head -1)"
[ -x "$bin" ] || { echo "test_safetensors not built"; exit 1; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

"$bin" --write-sample "$tmp/c.safetensors"

"$py" - "$tmp/c.safetensors" "$tmp/py.safetensors" <<'PY'
import json, struct, sys
import numpy as np

DT = {"F32": "<f4", "F64": "<f8", "I32": "<i4", "I64": "<i8"}
sample = {
    "w": np.arange(12, dtype=np.float32).reshape(3, 4) * np.float32(0.25) - np.float32(1.0),
    "b": np.arange(5, dtype=np.float64) / 3.0,
    "idx": (np.arange(6, dtype=np.int32) * 7 - 10).reshape(2, 3),
    "big": np.array([1 << 40, -(1 << 50) + 3], dtype=np.int64),
    "scalar": np.array(2.5, dtype=np.float32),
    "empty": np.zeros((0, 3), dtype=np.float32),
}
meta = {"format": "pt", "job": 'a "quoted" name \u00e9'}
name_of = {"<f4": "F32", "<f8": "F64", "<i4": "I32", "<i8": "I64"}

raw = open(sys.argv[1], "rb").read()
(n,) = struct.unpack("<Q", raw[:8])
assert n % 8 == 0, "header length %d not a multiple of 8" % n
text = raw[8:8 + n].decode("utf-8")
assert text.rstrip(" ") == text.strip(), "padding must be trailing spaces"
hdr = json.loads(text, object_pairs_hook=lambda p: p)
keys = [k for k, _ in hdr]
assert keys[0] == "__metadata__", keys
assert keys[1:] == sorted(sample), keys
hdr = dict(hdr)
got_meta = dict(hdr.pop("__metadata__"))
crcs = {k[len("pw.crc32c."):]: v for k, v in got_meta.items() if k.startswith("pw.crc32c.")}
assert {k: v for k, v in got_meta.items() if not k.startswith("pw.crc32c.")} == meta, got_meta
assert sorted(crcs) == sorted(sample), crcs
data = raw[8 + n:]


def crc32c(b):  # Castagnoli, reflected, written from its definition
    c = 0xFFFFFFFF
    for x in b:
        c ^= x
        for _ in range(8):
            c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
    return c ^ 0xFFFFFFFF


assert crc32c(b"123456789") == 0xE3069283
end = 0
for name in keys[1:]:
    e = dict(hdr[name])
    b, en = e["data_offsets"]
    assert b == end, (name, b, end)
    end = en
    want = sample[name]
    assert e["dtype"] == name_of[want.dtype.str], (name, e["dtype"])
    assert list(e["shape"]) == list(want.shape), (name, e["shape"])
    assert crcs[name] == "%08x" % crc32c(data[b:en]), (name, crcs[name])
    got = np.frombuffer(data[b:en], dtype=DT[e["dtype"]]).reshape(e["shape"])
    assert np.array_equal(got, want), (name, got, want)
assert end == len(data), "data must be exactly covered"
print("python read the C file: ok")

# Write it the other way round: reverse key order, unpadded header,
# a 3-byte gap before each tensor.
order = sorted(sample, reverse=True)
blob, entries = b"", {}
for name in order:
    blob += b"\xaa" * 3
    a = sample[name]
    entries[name] = {"dtype": name_of[a.dtype.str], "shape": list(a.shape),
                     "data_offsets": [len(blob), len(blob) + a.nbytes]}
    blob += a.tobytes()
entries["__metadata__"] = meta
h = json.dumps(entries, ensure_ascii=False).encode("utf-8")
if (8 + len(h)) % 8 == 0:
    h += b" "
open(sys.argv[2], "wb").write(struct.pack("<Q", len(h)) + h + blob)
PY

"$bin" --check-sample "$tmp/py.safetensors"
echo "C read the Python file: ok"

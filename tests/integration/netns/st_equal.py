#!/usr/bin/env python3
"""st_equal A B: the tensors of two safetensors files are equal bit for bit.

Reads each file's header (8-byte little-endian length, JSON) itself and
compares, tensor by tensor, the name, dtype, shape and the raw bytes. The
__metadata__ (step, job spec, format) is not compared: a gathered cluster
checkpoint and a single-process one say different things there. Exit 0
when equal, 1 naming what differs, 2 when a file is not safetensors."""
import json
import struct
import sys

MAX_HEADER = 100 << 20


def read(path):
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        sys.exit(f"st_equal: {path}: {len(raw)} bytes, not safetensors")
    (n,) = struct.unpack("<Q", raw[:8])
    if n > MAX_HEADER or 8 + n > len(raw):
        print(f"st_equal: {path}: header length {n} does not fit a {len(raw)}-byte file", file=sys.stderr)
        sys.exit(2)
    hdr = json.loads(raw[8:8 + n])
    hdr.pop("__metadata__", None)
    data = raw[8 + n:]
    out = {}
    for name, t in hdr.items():
        b, e = t["data_offsets"]
        if not 0 <= b <= e <= len(data):
            print(f"st_equal: {path}: {name}: data_offsets [{b}, {e}) outside {len(data)} bytes", file=sys.stderr)
            sys.exit(2)
        out[name] = (t["dtype"], tuple(t["shape"]), data[b:e])
    return out


def first_diff(dtype, x, y):
    """Where two equal-length byte strings first differ, as element index
    and (for F32) both values."""
    size = 4 if dtype == "F32" else 1
    for i in range(0, len(x), size):
        if x[i:i + size] != y[i:i + size]:
            if dtype == "F32":
                return f"element {i // 4}: {struct.unpack('<f', x[i:i + 4])[0]!r} vs {struct.unpack('<f', y[i:i + 4])[0]!r}"
            return f"byte {i}"
    return "nowhere"


def main():
    if len(sys.argv) != 3:
        print("usage: st_equal.py A B", file=sys.stderr)
        return 2
    a, b = read(sys.argv[1]), read(sys.argv[2])
    bad = []
    if not a:
        bad.append(f"{sys.argv[1]} holds no tensor")
    if set(a) != set(b):
        bad.append(f"tensor names differ: only in A {sorted(set(a) - set(b))}, only in B {sorted(set(b) - set(a))}")
    n_bytes = 0
    for name in sorted(set(a) & set(b)):
        (da, sa, xa), (db, sb, xb) = a[name], b[name]
        if (da, sa) != (db, sb):
            bad.append(f"{name}: {da}{list(sa)} vs {db}{list(sb)}")
        elif xa != xb:
            n_diff = sum(1 for i in range(0, len(xa), 4) if xa[i:i + 4] != xb[i:i + 4]) if da == "F32" else None
            bad.append(f"{name}: {n_diff} of {len(xa) // 4} elements differ, first at {first_diff(da, xa, xb)}"
                       if n_diff is not None else f"{name}: bytes differ, first at {first_diff(da, xa, xb)}")
        n_bytes += len(xa)
    for m in bad[:20]:
        print("  MISMATCH", m)
    if bad:
        return 1
    print(f"st_equal: {len(a)} tensors, {n_bytes} bytes, equal bit for bit")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""st: a tiny safetensors reader and writer in pure Python + numpy.

The reference test must not trust pipewright's own safetensors code, nor
depend on the `safetensors` pip package, so this is a second, independent
implementation of the format:

    8 bytes   little-endian unsigned 64-bit header length n
    n bytes   UTF-8 JSON header:
              {"<name>": {"dtype": "F32", "shape": [..], "data_offsets": [b, e]},
               ..., "__metadata__": {"key": "string value", ...}}   (optional)
    rest      raw little-endian, row-major tensor bytes; [b, e) are offsets
              relative to the first byte after the header

The reader is strict, like the Hugging Face implementation: every byte range
has the size its dtype and shape imply, ranges lie inside the data, and the
ranges tile the data buffer exactly (no gaps, no overlaps). The writer pads
the header with spaces so the data starts 8-byte aligned and writes to a
temporary file that is renamed over the target.

    python3 st.py --self-test        round-trip and corruption checks
    python3 st.py FILE               list the tensors of FILE
"""
import json
import os
import struct
import sys

import numpy as np

# safetensors dtype name -> numpy little-endian dtype. BF16 has no numpy
# type; it is read as uint16 and widened to float32 by hand.
_DTYPES = {
    "F64": "<f8", "F32": "<f4", "F16": "<f2",
    "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1",
    "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "u1", "BOOL": "?",
}
_ITEMSIZE = dict({k: np.dtype(v).itemsize for k, v in _DTYPES.items()}, BF16=2)


class SafetensorsError(ValueError):
    pass


def _st_dtype(arr):
    key = (arr.dtype.kind, arr.dtype.itemsize)
    for name, npdt in _DTYPES.items():
        if (np.dtype(npdt).kind, np.dtype(npdt).itemsize) == key:
            return name
    raise SafetensorsError(f"unsupported numpy dtype {arr.dtype}")


def load(path, strict=True):
    """Read FILE; returns (tensors: dict name -> np.ndarray, metadata: dict)."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise SafetensorsError(f"{path}: file too short ({len(blob)} bytes) for a header length")
    (n,) = struct.unpack("<Q", blob[:8])
    if n > len(blob) - 8:
        raise SafetensorsError(f"{path}: header length {n} exceeds file size {len(blob)}")
    try:
        header = json.loads(blob[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SafetensorsError(f"{path}: header is not valid UTF-8 JSON: {e}") from None
    if not isinstance(header, dict):
        raise SafetensorsError(f"{path}: header is not a JSON object")
    data = memoryview(blob)[8 + n:]
    meta = header.pop("__metadata__", {}) or {}
    if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                             for k, v in meta.items()):
        raise SafetensorsError(f"{path}: __metadata__ must map strings to strings")
    tensors, ranges = {}, []
    for name, info in header.items():
        if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
            raise SafetensorsError(f"{path}: {name}: entry must have exactly dtype, shape, data_offsets")
        dt, shape, offs = info["dtype"], info["shape"], info["data_offsets"]
        if dt not in _ITEMSIZE:
            raise SafetensorsError(f"{path}: {name}: unknown dtype {dt!r}")
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise SafetensorsError(f"{path}: {name}: bad shape {shape!r}")
        if (not isinstance(offs, list) or len(offs) != 2
                or not all(isinstance(o, int) for o in offs) or not 0 <= offs[0] <= offs[1]):
            raise SafetensorsError(f"{path}: {name}: bad data_offsets {offs!r}")
        b, e = offs
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if e - b != count * _ITEMSIZE[dt]:
            raise SafetensorsError(f"{path}: {name}: {dt} {shape} needs {count * _ITEMSIZE[dt]} bytes, "
                                   f"data_offsets give {e - b}")
        if e > len(data):
            raise SafetensorsError(f"{path}: {name}: data_offsets end {e} beyond data size {len(data)}")
        raw = bytes(data[b:e])
        if dt == "BF16":
            arr = (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view("<f4")
        else:
            arr = np.frombuffer(raw, _DTYPES[dt]).copy()
        tensors[name] = arr.reshape(shape)
        ranges.append((b, e, name))
    ranges.sort()
    pos = 0
    for b, e, name in ranges:
        if b < pos:
            raise SafetensorsError(f"{path}: {name}: data overlaps the previous tensor")
        if strict and b != pos:
            raise SafetensorsError(f"{path}: {name}: gap in data before offset {b}")
        pos = e
    if strict and pos != len(data):
        raise SafetensorsError(f"{path}: {len(data) - pos} trailing bytes after the last tensor")
    return tensors, meta


def save(path, tensors, metadata=None):
    """Write dict name -> array-like (numpy or torch) to path atomically."""
    header, chunks, pos = {}, [], 0
    for name in sorted(tensors):
        if name == "__metadata__":
            raise SafetensorsError("__metadata__ is not a tensor name")
        t = tensors[name]
        if hasattr(t, "detach"):  # torch tensor, without importing torch here
            t = t.detach().cpu().numpy()
        arr = np.array(t, order="C", copy=False)  # keeps 0-d shapes, unlike ascontiguousarray
        dt = _st_dtype(arr)
        raw = arr.astype(_DTYPES[dt], copy=False).tobytes(order="C")
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [pos, pos + len(raw)]}
        chunks.append(raw)
        pos += len(raw)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    hbytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hbytes += b" " * ((-len(hbytes)) % 8)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hbytes)))
        f.write(hbytes)
        for c in chunks:
            f.write(c)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _self_test():
    import tempfile
    rng = np.random.default_rng(0)
    src = {
        "a.weight": rng.standard_normal((3, 5)).astype(np.float32),
        "a.bias": rng.standard_normal(5).astype(np.float32),
        "ids": np.arange(7, dtype=np.int32),
        "big": rng.integers(-2**40, 2**40, size=(2, 2, 2)).astype(np.int64),
        "d": rng.standard_normal((1, 4)),
        "scalar": np.array(1.5, dtype=np.float32),
        "empty": np.zeros((0, 3), dtype=np.float32),
    }
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "x.safetensors")
        save(p, src, {"format": "pt", "step": 3})
        blob = open(p, "rb").read()
        (n,) = struct.unpack("<Q", blob[:8])
        assert (8 + n) % 8 == 0, "data not 8-byte aligned"
        hdr = json.loads(blob[8:8 + n])
        assert hdr["a.weight"] == {"dtype": "F32", "shape": [3, 5], "data_offsets":
                                   hdr["a.weight"]["data_offsets"]}
        b, e = hdr["a.weight"]["data_offsets"]
        # The raw bytes are exactly the little-endian row-major float32 values.
        assert blob[8 + n + b:8 + n + e] == src["a.weight"].astype("<f4").tobytes()
        got, meta = load(p)
        assert meta == {"format": "pt", "step": "3"}, meta
        assert set(got) == set(src)
        for k, v in src.items():
            assert got[k].dtype == v.dtype and got[k].shape == v.shape, k
            assert np.array_equal(got[k], v), k
        # A file written by hand, the way the format describes it.
        h = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                        "__metadata__": {"k": "v"}}).encode()
        with open(p, "wb") as f:
            f.write(struct.pack("<Q", len(h)) + h + struct.pack("<2f", 1.0, -2.0))
        got, meta = load(p)
        assert got["w"].tolist() == [1.0, -2.0] and meta == {"k": "v"}
        # BF16: 0x3f80 is 1.0
        h = json.dumps({"b": {"dtype": "BF16", "shape": [1], "data_offsets": [0, 2]}}).encode()
        with open(p, "wb") as f:
            f.write(struct.pack("<Q", len(h)) + h + b"\x80\x3f")
        assert load(p)[0]["b"].tolist() == [1.0]
        # Corruptions must be rejected.
        bad = [
            {"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}},     # size mismatch
            {"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}},    # beyond data
            {"w": {"dtype": "X9", "shape": [2], "data_offsets": [0, 8]}},      # dtype
            {"w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}},     # gap
            {"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
             "v": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}},     # overlap
        ]
        for hd in bad:
            h = json.dumps(hd).encode()
            with open(p, "wb") as f:
                f.write(struct.pack("<Q", len(h)) + h + b"\0" * 8)
            try:
                load(p)
            except SafetensorsError:
                continue
            raise AssertionError(f"accepted a corrupt header {hd}")
        with open(p, "wb") as f:
            f.write(struct.pack("<Q", 1000) + b"{}")
        try:
            load(p)
            raise AssertionError("accepted a header length beyond the file")
        except SafetensorsError:
            pass
    print("st.py self-test: ok")


if __name__ == "__main__":
    if len(sys.argv) == 2 and sys.argv[1] == "--self-test":
        _self_test()
    elif len(sys.argv) == 2:
        ts, md = load(sys.argv[1])
        for k in sorted(ts):
            print(f"{k:40s} {str(ts[k].dtype):8s} {list(ts[k].shape)}")
        if md:
            print("metadata:", md)
    else:
        sys.exit(__doc__)

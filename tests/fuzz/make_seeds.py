#!/usr/bin/env python3
"""make_seeds: write the seed corpora of fuzz_frame, fuzz_control and
fuzz_safetensors into corpus/ (fuzz_spec's seeds are the example jobs).
The frame seeds leave the checksums zero: their first byte asks the
harness to fix them up. Run from anywhere; rerun when a format changes."""
import json, os, struct

HERE = os.path.dirname(os.path.abspath(__file__))


def put(name, i, data):
    d = os.path.join(HERE, "corpus", name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, f"seed-{i:02d}"), "wb") as f:
        f.write(data)


def frame(kind, dtype, dims, payload, job=7, chunk=0, step=3, mb=1, stage=1, value=5, flags=0):
    dd = list(dims) + [0] * (4 - len(dims))
    return struct.pack("<4sHHIIIIIIBBH4IIII", b"PWF1", 2, kind, job, chunk, step, mb, stage, value,
                       dtype, len(dims), flags, *dd, len(payload), 0, 0) + payload


hello = json.dumps({"job": 7, "run": 2, "rank": 1, "token": "t"}).encode()
acts = struct.pack("<6f", *[0.5 * i for i in range(6)])
seeds = [
    frame(1, 2, [len(hello)], hello),
    frame(1, 2, [len(hello)], hello) + frame(2, 0, [2, 3], acts),
    frame(3, 0, [2, 3], acts) + frame(6, 2, [0], b""),
    frame(4, 0, [], struct.pack("<f", 2.0), flags=1),
    frame(5, 1, [3], struct.pack("<3i", 1, 2, 3)),
    frame(6, 2, [5], b"abort"),
    # one tensor in two chunks: the header describes the whole tensor
    frame(2, 0, [2, 3], acts[:12], flags=2) + frame(2, 0, [2, 3], acts[12:], chunk=1, flags=3),
    # a snapshot's three parts (parameters, m, v) of a 6-float stage
    frame(7, 0, [6], acts, mb=0, value=0) + frame(7, 0, [6], acts, mb=0, value=1) + frame(7, 0, [6], acts, mb=0, value=2),
    # a bf16 activation (train.precision "bf16"): 2 bytes an element
    frame(2, 3, [2, 3], struct.pack("<6H", *[0x3f80 + i for i in range(6)])),
    # serving: a microbatch's sequences, its activation, the sampled tokens back
    frame(8, 1, [1, 14], struct.pack("<14i", 0, 0, 2, 1, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0)) + frame(2, 0, [2, 3], acts),
    frame(9, 1, [2], struct.pack("<2i", 65, 66)),
    # tensor parallel: a call's reduce-scatter shard (value 9), then its sum back (value 10)
    frame(4, 0, [6], acts, step=0, mb=1, stage=0, value=9) + frame(4, 0, [6], acts, step=0, mb=1, stage=0, value=10),
]
for i, s in enumerate(seeds):
    for mode in (2, 3, 2 | (7 << 2)):  # fix CRCs; + set_dest; + 8-byte reads
        put("fuzz_frame", 3 * i + [2, 3, 2 | (7 << 2)].index(mode), bytes([mode]) + s)

msgs = [
    {"type": "register", "version": 1, "name": "w1", "token": "x", "data_addr": "127.0.0.1:9",
     "cores": 2, "threads": 1, "software": "pipewright 0.1.0", "memory": 1 << 30, "blas_core": "Haswell",
     "blas_forced": 1, "cpu_level": "avx512", "gemm_gflops": 110.5},
    {"type": "heartbeat", "time": 1.5, "state": "idle"},
    {"type": "step", "job": 1, "run": 1, "rank": 0, "step": 3, "loss": 2.5, "step_time": 0.1,
     "tokens": 512, "eval_loss": 2.25, "actions": [["F", 0, 0, 0.0, 0.1], ["B", 0, 0, 0.1, 0.2]]},
    {"type": "checkpoint", "job": 1, "run": 1, "rank": 0, "step": 10, "path": "a/b", "bytes": 9},
    {"type": "done", "job": 1, "run": 1, "rank": 0},
    {"type": "error", "message": "boom"},
    {"type": "error", "job": 1, "run": 2, "rank": 0, "message": "lost peer", "lost_rank": 1, "restore_failed": 1},
    {"type": "snapshot", "job": 1, "run": 2, "rank": 0, "stage": 0, "step": 4, "held": 1},
    {"type": "assign", "job": 1, "run": 2, "rank": 0, "slice": "{}", "slice_sha256": "ab",
     "peers": [{"rank": 0, "addr": "127.0.0.1:7001", "host": "m1"}, {"rank": 1, "addr": "10.0.0.2:7002", "host": "m1"}],
     "steps": 9, "start_step": 4, "restore_step": 4, "restore_from": [1, 0], "upload_token": "ab" * 32},
    {"type": "welcome", "version": 1, "worker_id": 2, "heartbeat_interval": 1.0},
    {"type": "refused", "reason": "token"},
    {"type": "cancel", "job": 1, "run": 1, "reason": "user"},
    {"type": "shutdown"},
]
msgs_serve = [
    {"type": "generate", "job": 1, "run": 2, "req": 7, "prompt": [1, 2, 3], "max_tokens": 4, "temperature": 0.8,
     "top_k": 5, "top_p": 0.9, "seed": 11},
    {"type": "tokens", "job": 1, "run": 2, "rank": 1, "items": [7, 65, 8, 66]},
    {"type": "gen_failed", "job": 1, "run": 2, "rank": 0, "req": 7, "message": "queue full"},
    {"type": "assign", "job": 1, "run": 2, "rank": 0, "slice": "{}", "slice_sha256": "ab", "peers": [],
     "steps": 0, "start_step": 0, "serve_seqs": 4, "serve_len": 32, "serve_queue": 8},
]
for i, m in enumerate(msgs):
    body = json.dumps(m).encode()
    put("fuzz_control", i, bytes([255]) + struct.pack(">I", len(body)) + body)
put("fuzz_control", len(msgs), bytes([3]) + b"".join(
    struct.pack(">I", len(json.dumps(m))) + json.dumps(m).encode() for m in msgs[:3]))
for i, m in enumerate(msgs_serve):  # indexes of their own
    body = json.dumps(m).encode()
    put("fuzz_control", 50 + i, bytes([255]) + struct.pack(">I", len(body)) + body)
# register with the machine's identity (host, hostname); an index of its own
reg_host = json.dumps(dict(msgs[0], host="3d1219c7c4c5404aaa1f6d2a48adfda4", hostname="node-a")).encode()
put("fuzz_control", 40, bytes([255]) + struct.pack(">I", len(reg_host)) + reg_host)
# a traced step of a dp 2, tp 2 rank: every field the worker sends (its
# exchanges' bytes and seconds, the collectives in actions, the trace object)
step_all = json.dumps(dict(msgs[2], peak_act=1 << 20, grad_norm=0.5, lr=3e-4, nonfinite=2, dp_bytes=8192,
                           dp_seconds=0.003, tp_bytes=4096, tp_seconds=0.002,
                           actions=msgs[2]["actions"] + [["T", 0, 0, 0.05, 0.06], ["D", 0, 0, 0.2, 0.25]],
                           trace={"ready": [0.0, 0.1], "routed": [0.11, 0.21], "end_wait": 0.01, "end_work": 0.02,
                                  "after": 0.001, "t0": 86400.5, "sleeps": 2})).encode()
put("fuzz_control", 41, bytes([255]) + struct.pack(">I", len(step_all)) + step_all)

# safetensors: a small valid file with two tensors and metadata.
tensors = {"a.weight": ("F32", [2, 3], struct.pack("<6f", *range(6))),
           "b": ("I32", [2], struct.pack("<2i", 4, 5)),
           "c": ("I64", [1], struct.pack("<q", 9)),
           "d": ("F64", [1], struct.pack("<d", 1.5))}
hdr, data = {"__metadata__": {"format": "pt", "step": "3"}}, b""
for k, (dt, shape, raw) in tensors.items():
    hdr[k] = {"dtype": dt, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
    data += raw
h = json.dumps(hdr).encode()
h += b" " * (-len(h) % 8)
put("fuzz_safetensors", 0, struct.pack("<Q", len(h)) + h + data)
h0 = json.dumps({"__metadata__": {}}).encode()
h0 += b" " * (-len(h0) % 8)
put("fuzz_safetensors", 1, struct.pack("<Q", len(h0)) + h0)


# token files (common/io/tokfile.h): width 2 and 4, a tiny vocabulary, and text.
def tok(width, vocab, ids):
    fmt = "<H" if width == 2 else "<I"
    return b"PWTOKENS" + struct.pack("<IIIIQ", 1, width, vocab, 0, len(ids)) + b"".join(struct.pack(fmt, i) for i in ids)


for i, s in enumerate([tok(2, 256, [k % 256 for k in range(40)]), tok(4, 70000, [(k * 7919) % 70000 for k in range(40)]),
                       tok(2, 5, [1, 2, 3, 4, 0] * 8), b"just text, not tokens\n" * 3]):
    put("fuzz_tokfile", i, s)


# TensorBoard event files (common/io/tfevents.h), written here with a
# CRC-32C of their own. The first byte: 0 the file as it is, 1 the harness
# fixes up both CRCs of each record first (those seeds leave them zero).
def crc32c(b):
    c = 0xFFFFFFFF
    for x in b:
        c ^= x
        for _ in range(8):
            c = (c >> 1) ^ (0x82F63B78 & -(c & 1))
    return c ^ 0xFFFFFFFF


def masked(b):
    c = crc32c(b)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def varint(v):
    v &= (1 << 64) - 1
    out = b""
    while v >= 0x80:
        out += bytes([v & 0x7F | 0x80])
        v >>= 7
    return out + bytes([v])


def ld(field, body):
    return varint(field << 3 | 2) + varint(len(body)) + body


def event(wall, step, what):
    return b"\x09" + struct.pack("<d", wall) + (b"\x10" + varint(step) if step else b"") + what


def scalars(vals):
    return ld(5, b"".join(ld(1, ld(1, t.encode()) + b"\x15" + struct.pack("<f", v)) for t, v in vals))


def record(data, crcs=True):
    n = struct.pack("<Q", len(data))
    return n + struct.pack("<I", masked(n) if crcs else 0) + data + struct.pack("<I", masked(data) if crcs else 0)


tf_events = [event(1.7e9, 0, ld(3, b"brain.Event:2")), event(1.7e9 + 1, 0, ld(7, b"\x08\x01")),
             event(1.7e9 + 2, 0, scalars([("train/loss", 5.5), ("train/lr", 3e-4), ("eval/loss", 5.6)])),
             event(1.7e9 + 3, 1, scalars([("train/loss", 4.25), ("pipeline/rank1/bubble", 0.125)])),
             event(1.7e9 + 4, -2, scalars([("x", -1.5)]))]
tf_file = b"".join(record(e) for e in tf_events)
# a TF2 tensor scalar with metadata beside a simple one, and source_metadata (field 10)
tf_foreign = bytes.fromhex("09000000000000f83f10072a330a210a087466322f6c6f7373420808012a040000a03f4a0b0a090a0773"
                           "63616c6172730a0e0a076f6c642f616363150000403f52090a077079746f726368")
for i, s in enumerate([b"\x00" + tf_file, b"\x00" + tf_file[:len(tf_file) - 7], b"\x00",
                       b"\x01" + b"".join(record(e, False) for e in tf_events),
                       b"\x01" + record(tf_foreign, False) + record(b"\x2a\x03\x0a\x01\x15", False),
                       b"\x01" + record(event(2.0, 5, ld(5, ld(1, ld(1, b"a") + b"\x15\x00\x00\x80\x3f" + ld(8, b"\x08\x01")))),
                                        False)]):
    put("fuzz_tfevents", i, s)

# fuzz_tokenizer: 0 + a tokenizer.json of each kind common/text reads; 1 + text
# for the harness's fixed tokenizers
M = "\u2581"
tok_seeds = [
    {"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "c": 2, "ab": 3, "bc": 4, "abc": 5},
               "merges": ["#version: 0.2", "b c", "a bc"]}},
    {"version": "1.0", "truncation": None, "padding": None,
     "added_tokens": [{"id": 6, "content": "<|endoftext|>", "special": True, "normalized": False, "lstrip": False,
                       "rstrip": False, "single_word": False},
                      {"id": 7, "content": "[MASK]", "special": True, "normalized": False, "lstrip": True,
                       "rstrip": True, "single_word": True}],
     "normalizer": {"type": "NFC"},
     "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
         {"type": "Split", "pattern": {"Regex": r"(?i:'s|'t)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|\s+(?!\S)|\s+"},
          "behavior": "Isolated", "invert": False},
         {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
     "post_processor": {"type": "Sequence", "processors": [
         {"type": "ByteLevel", "trim_offsets": False},
         {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}},
                                                   {"Sequence": {"id": "A", "type_id": 0}}], "pair": [],
          "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [6], "tokens": ["<|endoftext|>"]}}}]},
     "decoder": {"type": "ByteLevel"},
     "model": {"type": "BPE", "ignore_merges": True, "vocab": {"H": 0, "e": 1, "l": 2, "o": 3, "He": 4, "ll": 5},
               "merges": [["H", "e"], ["l", "l"]]}},
    {"normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": M},
                                                        {"type": "Replace", "pattern": {"String": " "}, "content": M}]},
     "decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": M}, "content": " "},
                                                  {"type": "ByteFallback"}, {"type": "Fuse"},
                                                  {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
     "model": {"type": "BPE", "unk_token": "<unk>", "byte_fallback": True, "fuse_unk": True,
               "vocab": {"<unk>": 0, "<0xC3>": 1, "<0xA9>": 2, M: 3, "a": 4, M + "a": 5}, "merges": [M + " a"]}},
    {"pre_tokenizer": {"type": "Metaspace", "replacement": M, "prepend_scheme": "first", "split": True},
     "decoder": {"type": "Metaspace", "replacement": M, "prepend_scheme": "first", "split": True},
     "post_processor": {"type": "BertProcessing", "sep": ["b", 1], "cls": ["a", 0]},
     "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, M: 2, M + "a": 3}, "merges": [[M, "a"]],
               "continuing_subword_prefix": "##", "end_of_word_suffix": "</w>"}},
    {"pre_tokenizer": {"type": "Split", "pattern": {"String": "x"}, "behavior": "MergedWithNext", "invert": True},
     "model": {"type": "BPE", "vocab": {"x": 0, "y": 1}, "merges": []}},
]
texts = ["Hello, world! It's 2024.", "  spaces\t\ttabs\n\nlines \r\n",
         "\U0001F600 \u6f22\u5b57 e\u0301 " + M + "x <|endoftext|> hello world", "ab a  b\u00e9"]
for i, s in enumerate([b"\x00" + json.dumps(t).encode() for t in tok_seeds] + [b"\x01" + t.encode() for t in texts]):
    put("fuzz_tokenizer", i, s)


# cpulists (common/base/cpuset.h): "allowed|used|node", the first byte also
# the number of CPUs wanted (mod 16).
for i, s in enumerate([b"2-15|0-3|4-11", b"0-3,8,10-11|2|0-7", b"3|3|3", b"0-1023||0-511", b"|\n|", b"5,4,6|1-|x"]):
    put("fuzz_cpuset", i, s)

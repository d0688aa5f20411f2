#!/usr/bin/env python3
"""test_generate_fuzz: POST /v1/jobs/{id}/generate fuzzed against a live
serve job — a real coordinator and two real workers on loopback serve a
tiny GPT (pp 2), and seeded random bodies go to its generate endpoint:
valid bodies mutated field by field (wrong types, out-of-range and huge
numbers, prompts of 0 to 200 items, lists of lists, unknown fields, bytes
that are not UTF-8, truncated JSON, deep nesting), plain random bytes, and
streams cut off mid-request. Each answer must be 200 or a 4xx with the
API's error shape (never a 5xx, never a dropped connection); the
coordinator and the workers stay up; afterwards a plain request still gets
the same tokens as before the fuzzing (the serve job's state was not
corrupted), and /metrics still answers. The crash this found first: 65
prompts while a serve job serves freed a sequence array that was still
NULL (issue 32).

PW_FUZZ_REQUESTS (default 1500, 500 under the sanitizers) bounds the
requests; PW_TEST_SEED repeats a run's choices.
Usage: test_generate_fuzz.py BUILD_DIR SOURCE_DIR"""
import http.client, json, os, random, socket, sys, tempfile, time

import driver as d

BUILD, SRC = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
check = d.Checks()
SANITIZE = os.environ.get("PW_SANITIZE", "OFF") == "ON"
N = int(os.environ.get("PW_FUZZ_REQUESTS", "500" if SANITIZE else "1500"))
SEED = int(os.environ.get("PW_TEST_SEED", str(int(time.time()))))
OK_STATUS = {200, 400, 404, 409, 413, 422, 429}


def spec(steps=10):
    return {"name": "gen-fuzz",
            "model": {"template": "gpt", "vocab_size": 256, "seq_len": 32, "d_model": 32, "n_layers": 2,
                      "n_heads": 2},
            "mesh": {"pp": 2}, "schedule": {"name": "1f1b", "microbatches": 2},
            "train": {"steps": steps, "batch_size": 4, "seed": 3, "checkpoint_every": steps,
                      "optimizer": {"name": "adamw", "lr": 1e-2}},
            "data": {"kind": "text", "path": os.path.join(SRC, "examples/data/corpus.txt"), "sampler": "sequential"}}


def odd_value(rnd):
    return rnd.choice([None, True, False, -1, 0, 1, 2 ** 31, 2 ** 63 - 1, -2 ** 63, 1e308, -1e308, 0.5, "",
                       "x" * rnd.randint(1, 300), "\u00e9\u4e2d\U0001f600", [], {}, [1, 2], {"a": 1},
                       [[1, 2], [3]], [-5, 300, 7], list(range(rnd.randint(0, 200))),
                       ["a"] * rnd.randint(0, 80), [None], [1.5], [""]])


def body(rnd):
    """One request body, as bytes."""
    kind = rnd.random()
    if kind < 0.08:  # plain random bytes
        return bytes(rnd.getrandbits(8) for _ in range(rnd.randint(0, 400)))
    if kind < 0.12:  # deep nesting
        n = rnd.randint(1, 5000)
        return b'{"prompt": ' + b"[" * n + b"1" + b"]" * n + b"}"
    b = {"prompt": rnd.choice(["The ", "a", "", [1, 2, 3], ["The ", "and"], ["a"] * rnd.randint(1, 70)]),
         "max_tokens": rnd.randint(1, 6)}
    for k in ("temperature", "top_k", "top_p", "seed", "stream"):
        if rnd.random() < 0.3:
            b[k] = rnd.choice([0.7, 0, 5, 0.9, 7, False])
    for _ in range(rnd.randint(0, 3)):  # mutate fields
        k = rnd.choice(["prompt", "max_tokens", "temperature", "top_k", "top_p", "seed", "stream", "promptt", ""])
        b[k] = odd_value(rnd)
    if rnd.random() < 0.05:
        b = rnd.choice([[b], "text", 3, None])
    raw = json.dumps(b).encode()
    if rnd.random() < 0.08:  # truncated
        raw = raw[:rnd.randint(0, len(raw))]
    if rnd.random() < 0.03:  # a byte that is not UTF-8 inside a string
        raw = raw.replace(b'"The ', b'"\xff\xfeThe ', 1)
    return raw


def post(port, path, raw):
    """(status, parsed body or None); status 0 when the connection failed."""
    try:
        h = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        h.request("POST", path, raw, {"Content-Type": "application/json"})
        r = h.getresponse()
        text = r.read()
        h.close()
    except (OSError, http.client.HTTPException) as e:
        return 0, str(e)
    if r.getheader("Content-Type", "").startswith("text/event-stream"):
        return r.status, text.decode(errors="replace")
    try:
        return r.status, json.loads(text)
    except ValueError:
        return r.status, text[:200]


def cut_off(port, path, rnd):
    """A request whose body stops short of its Content-Length, then closes."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    raw = json.dumps({"prompt": "The ", "max_tokens": 3}).encode()
    s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              f"Content-Length: {len(raw) + 50}\r\n\r\n".encode() + raw[:rnd.randint(0, len(raw))])
    s.close()


def main():
    print(f"seed {SEED}, {N} requests")
    rnd = random.Random(SEED)
    tmp = tempfile.mkdtemp(prefix="pw-genfuzz-")
    c = d.Cluster(BUILD, tmp, "gf", data_root=SRC)
    for i in range(2):
        c.start_worker(f"w{i}")
    check("2 workers idle", c.wait_idle(2))
    sp = spec()
    tid = c.submit(sp)
    check("training succeeds", c.wait_job(tid).get("state") == "succeeded", c.job(tid))
    sid = c.submit(dict(sp, name="gen-fuzz-serve", mode="serve", init={"job": tid, "step": 10},
                        serve={"max_sequences": 4, "max_len": 32, "max_queue": 64}))
    serving = d.wait_for(lambda: c.job(sid).get("state") == "running" and c.job(sid).get("status") == "serving", 120)
    check("the serve job serves", serving, c.job(sid))
    path = f"/v1/jobs/{sid}/generate"
    plain = {"prompt": "The ", "max_tokens": 5}
    st, before = post(c.http_port, path, json.dumps(plain).encode())
    check("a plain request is answered", st == 200 and "results" in before, (st, before))

    bad, counts, t0 = [], {}, time.time()
    for i in range(N):
        if rnd.random() < 0.02:
            cut_off(c.http_port, path, rnd)
            continue
        raw = body(rnd)
        st, r = post(c.http_port, path, raw)
        counts[st] = counts.get(st, 0) + 1
        shaped = st == 200 or (isinstance(r, dict) and isinstance(r.get("error"), dict)
                               and {"code", "message", "path"} <= set(r["error"]))
        if st not in OK_STATUS or not shaped:
            bad.append((i, st, raw[:200], str(r)[:200]))
            if st == 0:  # the coordinator may be gone: stop, say it
                break
    print(f"answers by status: {dict(sorted(counts.items()))} in {time.time() - t0:.0f} s")
    check(f"{N} fuzzed bodies: each answered 200 or a 4xx with the error shape", not bad, bad[:3])
    check("the coordinator is up", c.coord.poll() is None, c.coord.returncode)
    check("the workers are up", all(p.poll() is None for p in c.workers.values()),
          {n: p.returncode for n, p in c.workers.items()})
    check("the serve job still serves", c.job(sid).get("status") == "serving", c.job(sid))
    st, after = post(c.http_port, path, json.dumps(plain).encode())
    toks = lambda r: [x["tokens"] for x in r.get("results", [])] if isinstance(r, dict) else r  # noqa: E731
    check("the plain request gets the same tokens as before the fuzzing",
          st == 200 and toks(after) == toks(before), (st, after, before))
    st, m = d.http(c.base, "/metrics")
    check("/metrics answers", st == 200 and "pipewright_generate_sequences_total" in str(m), st)
    st, _ = d.http(c.base, f"/v1/jobs/{sid}", "DELETE")
    check("the serve job is cancelled", st == 200 and c.wait_job(sid, 60).get("state") == "cancelled", st)
    d.close_cluster(c, tmp, check, lambda: check.failed)
    print(f"{check.passed} passed, {check.failed} failed (seed {SEED})")
    return 1 if check.failed else 0


if __name__ == "__main__":
    sys.exit(main())

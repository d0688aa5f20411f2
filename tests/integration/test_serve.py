#!/usr/bin/env python3
"""test_serve: serve jobs (mode "serve", docs/serving.md) on a real
coordinator and 4 workers on loopback, over real HTTP.

A GPT and a Llama are trained by pipewright (pp=2, the text corpus), then
served from their checkpoints ("init": {job, step}). Asserts:
  - every answer equals `pipewright generate` (the single-process oracle)
    on the same checkpoint, token for token, greedy and with seeded
    temperature/top-k/top-p sampling: GPT at pp=2, pp=4 and pp=1 x dp=2,
    Llama at pp=2 x dp=2, with several clients at once (each request's tokens do not
    depend on what else is served), a list of prompts in one request too;
  - 200 concurrent streaming requests all complete: each stream's token
    events come in order (n = 0, 1, ...), hold exactly its own prompt's
    oracle tokens (none of another's), and end with a "done" event whose
    tokens are the same;
  - `pipewright generate --coordinator URL --job ID --stream` prints the
    oracle's text;
  - bad requests get a 4xx naming the field (422 invalid_request for a field): a prompt longer than
    serve.max_len, max_tokens past it, temperature / top_p / top_k out of
    range, an unknown field, an unknown job (404), a job that is not a
    serve job (409), a body over the bound (413), more prompts than the
    job takes (429 at serve.max_queue);
  - a serve job is cancelled with DELETE /v1/jobs/{id}; its open requests
    fail, and its workers return to idle.
Usage: test_serve.py BUILD_DIR SOURCE_DIR"""
import http.client, json, os, subprocess, sys, tempfile, threading

import driver as d

BUILD, SRC = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
check = d.Checks()
ENV = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
PROMPTS = ["The ", "and then", "It was a", "He said", "Once upon", "in the", "What is", "She "]


def spec(name, template, steps=30):
    return {"name": name,
            "model": {"template": template, "vocab_size": 256, "seq_len": 32, "d_model": 32, "n_layers": 4,
                      "n_heads": 2},
            "mesh": {"pp": 2}, "schedule": {"name": "1f1b", "microbatches": 4},
            "train": {"steps": steps, "batch_size": 8, "seed": 3, "checkpoint_every": steps,
                      "optimizer": {"name": "adamw", "lr": 1e-2}},
            "data": {"kind": "text", "path": os.path.join(SRC, "examples/data/corpus.txt"), "sampler": "sequential"}}


def serving(sp, jid, steps, pp, dp=1, seqs=8, queue=256, name="serve"):
    return dict(sp, name=name, mode="serve", mesh={"pp": pp, "dp": dp}, init={"job": jid, "step": steps},
                serve={"max_sequences": seqs, "max_len": 32, "max_queue": queue})


class Oracle:
    """`pipewright generate` on a checkpoint, memoised."""

    def __init__(self, tmp, tag, sp, blob):
        self.job, self.ck, self.memo = os.path.join(tmp, tag + ".json"), os.path.join(tmp, tag + ".st"), {}
        json.dump(sp, open(self.job, "w"))
        open(self.ck, "wb").write(blob)

    def __call__(self, prompt, n, temperature=0, top_k=0, top_p=1, seed=1):
        key = (prompt, n, temperature, top_k, top_p, seed)
        if key not in self.memo:
            r = subprocess.run([os.path.join(BUILD, "pipewright"), "generate", "--job", self.job, "--checkpoint",
                                self.ck, "--prompt-tokens", ",".join(str(b) for b in prompt.encode()),
                                "--max-tokens", str(n), "--temperature", str(temperature), "--top-k", str(top_k),
                                "--top-p", str(top_p), "--seed", str(seed)], capture_output=True, text=True, env=ENV)
            self.memo[key] = [int(t) for t in r.stdout.strip().split(",")] if r.returncode == 0 else r.stderr
        return self.memo[key]


def generate(c, jid, body, timeout=120):
    return d.http(c.base, f"/v1/jobs/{jid}/generate", "POST", body, timeout=timeout)


def concurrently(fns):
    out = [None] * len(fns)

    def run(i):
        out[i] = fns[i]()
    ts = [threading.Thread(target=run, args=(i,)) for i in range(len(fns))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(300)
    return out


def stream(c, jid, body):
    """(status, [token events], final event name, final data) of a streaming request."""
    try:
        h = http.client.HTTPConnection("127.0.0.1", c.http_port, timeout=120)
        h.request("POST", f"/v1/jobs/{jid}/generate", json.dumps(dict(body, stream=True)),
                  {"Content-Type": "application/json"})
        r = h.getresponse()
        text = r.read().decode()
        h.close()
    except (OSError, http.client.HTTPException) as e:
        return 0, [], None, str(e)
    toks, final, data = [], None, None
    for block in text.split("\n\n"):
        ev, payload = None, None
        for line in block.split("\n"):
            if line.startswith("event: "):
                ev = line[7:]
            elif line.startswith("data: "):
                payload = json.loads(line[6:])
        if payload is None:
            continue
        if ev is None:
            toks.append(payload)
        else:
            final, data = ev, payload
    return r.status, toks, final, data


def equal_cases(c, jid, oracle, tag, n=6):
    """Greedy and sampled requests, several at once, against the oracle."""
    cases = [(p, 6, 0, 0, 1, 1) for p in PROMPTS[:n]] + \
            [(p, 6, 0.9, 40, 0.95, 100 + i) for i, p in enumerate(PROMPTS[:n])]
    got = concurrently([lambda k=k: generate(c, jid, {"prompt": k[0], "max_tokens": k[1], "temperature": k[2],
                                                      "top_k": k[3], "top_p": k[4], "seed": k[5]}) for k in cases])
    bad = [(k, g) for k, g in zip(cases, got)
           if g[0] != 200 or g[1]["results"][0]["tokens"] != oracle(*k)]
    check(f"{tag}: {len(cases)} concurrent requests (greedy and seeded sampling) equal the oracle's tokens",
          not bad, [(k, g, oracle(*k)) for k, g in bad[:2]])
    st, r = generate(c, jid, {"prompt": PROMPTS[:3], "max_tokens": 5, "temperature": 0.7, "seed": 9})
    want = [oracle(p, 5, 0.7, 0, 1, 9) for p in PROMPTS[:3]]
    check(f"{tag}: a list of prompts gets each prompt's oracle tokens",
          st == 200 and [x["tokens"] for x in r["results"]] == want, (st, r, want))


def metrics(c):
    """{series: value} of the coordinator's /metrics, the generate series."""
    st, text = d.http(c.base, "/metrics")
    out = {}
    for line in (text if isinstance(text, str) else "").splitlines():
        if line.startswith("pipewright_generate_"):
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out


def wait_serving(c, jid):
    return d.wait_for(lambda: c.job(jid).get("state") == "running" and c.job(jid).get("status") == "serving", 120)


def cancel(c, jid, n_workers, tag):
    st, _ = d.http(c.base, f"/v1/jobs/{jid}", "DELETE")
    job = c.wait_job(jid, 60)
    check(f"{tag}: cancelled with DELETE /v1/jobs/{{id}}", st == 200 and job.get("state") == "cancelled", (st, job))
    check(f"{tag}: its workers return to idle", c.wait_idle(n_workers, 60), c.worker_rows())


def big_body(c, jid, n):
    """(status, body) of a request of n bytes (the server may answer before
    it has read them: a write that then fails is not the answer)."""
    h = http.client.HTTPConnection("127.0.0.1", c.http_port, timeout=120)
    h.putrequest("POST", f"/v1/jobs/{jid}/generate")
    h.putheader("Content-Type", "application/json")
    h.putheader("Content-Length", str(n))
    h.endheaders()
    try:
        h.send(b'{"prompt": "' + b"a" * (n - 14) + b'"}')
    except OSError:
        pass
    try:
        r = h.getresponse()
        return r.status, r.read()
    except (OSError, http.client.HTTPException) as e:
        return 0, str(e)


def bad_requests(c, sid, train_id):
    cases = [({"prompt": "x" * 33}, 422, "prompt"),
             ({"prompt": "abc", "max_tokens": 31}, 422, "max_tokens"),
             ({"prompt": "abc", "temperature": -1}, 422, "temperature"),
             ({"prompt": "abc", "top_p": 0}, 422, "top_p"),
             ({"prompt": "abc", "top_k": -2}, 422, "top_k"),
             ({"prompt": [1, 2, 300]}, 422, "prompt"),
             ({"prompt": "abc", "tempurature": 1}, 422, "tempurature"),
             ({"max_tokens": 3}, 422, "prompt")]
    for body, want, path in cases:
        st, r = generate(c, sid, body)
        check(f"bad request {json.dumps(body)[:40]}: {want} naming {path}",
              st == want and isinstance(r, dict) and r["error"]["path"] == path, (st, r))
    st, r = generate(c, 999, {"prompt": "abc"})
    check("unknown job: 404", st == 404, (st, r))
    st, r = generate(c, train_id, {"prompt": "abc"})
    check("a training job: 409 saying it is not a serve job",
          st == 409 and "not a serve job" in r["error"]["message"], (st, r))
    st, r = big_body(c, sid, 9 << 20)
    check("a body over the bound: 413", st == 413, (st, str(r)[:200]))


def main():
    tmp = tempfile.mkdtemp(prefix="pw-serve-")
    c = d.Cluster(BUILD, tmp, "sv", data_root=SRC)
    for i in range(4):
        c.start_worker(f"w{i}")
    check("4 workers idle", c.wait_idle(4))
    gpt, llama = spec("gpt", "gpt"), spec("llama", "llama")
    gid, lid = c.submit(gpt), c.submit(llama)
    for tag, jid in (("gpt", gid), ("llama", lid)):
        check(f"{tag}: training succeeds", c.wait_job(jid).get("state") == "succeeded", c.job(jid))
    og = Oracle(tmp, "gpt", gpt, c.checkpoint(gid))
    ol = Oracle(tmp, "llama", llama, c.checkpoint(lid))
    check("the oracle answers", isinstance(og("The ", 6), list), og("The ", 6))

    # GPT at pp=2: equality, 200 streams, the CLI, bad requests, cancel
    sid = c.submit(serving(gpt, gid, 30, pp=2))
    check("gpt pp=2: the serve job is running, status serving", wait_serving(c, sid), c.job(sid))
    equal_cases(c, sid, og, "gpt pp=2")
    res = concurrently([lambda i=i: stream(c, sid, {"prompt": PROMPTS[i % 8], "max_tokens": 4,
                                                    "temperature": 0.8, "seed": i % 8}) for i in range(200)])
    want = [og(PROMPTS[i % 8], 4, 0.8, 0, 1, i % 8) for i in range(200)]
    bad = [(i, r) for i, r in enumerate(res)
           if r[0] != 200 or [t["n"] for t in r[1]] != [0, 1, 2, 3] or {t["index"] for t in r[1]} != {0}
           or [t["token"] for t in r[1]] != want[i] or r[2] != "done" or r[3]["results"][0]["tokens"] != want[i]]
    check("200 concurrent streams complete, each with its own oracle tokens in order, then done",
          not bad, [(i, r, want[i]) for i, r in bad[:2]])
    m = metrics(c)
    # 12 + 3 sequences of equal_cases (6 and 5 tokens), then the 200 streams' 4
    check("/metrics counts every sequence and token served so far",
          m.get('pipewright_generate_sequences_total{outcome="complete"}') == 12 + 3 + 200
          and m.get("pipewright_generate_tokens_total") == 12 * 6 + 3 * 5 + 200 * 4, m)
    cli = subprocess.run([os.path.join(BUILD, "pipewright"), "generate", "--coordinator", c.base, "--job", str(sid),
                          "--prompt", "It was a", "--max-tokens", "8", "--stream"], capture_output=True, env=ENV)
    check("pipewright generate --coordinator --stream prints the oracle's text",
          cli.returncode == 0 and cli.stdout == bytes(og("It was a", 8)) + b"\n", (cli.stdout, cli.stderr))
    bad_requests(c, sid, gid)
    cancel(c, sid, 4, "gpt pp=2")

    # GPT at pp=4
    sid = c.submit(serving(gpt, gid, 30, pp=4))
    check("gpt pp=4: serving", wait_serving(c, sid), c.job(sid))
    equal_cases(c, sid, og, "gpt pp=4", n=3)
    cancel(c, sid, 4, "gpt pp=4")

    # GPT at pp=1 x dp=2: rank 0 is the last stage too
    sid = c.submit(serving(gpt, gid, 30, pp=1, dp=2))
    check("gpt pp=1 dp=2: serving", wait_serving(c, sid), c.job(sid))
    equal_cases(c, sid, og, "gpt pp=1 dp=2", n=3)
    cancel(c, sid, 4, "gpt pp=1 dp=2")

    # Llama at pp=2 x dp=2, two sequences per replica and no queue
    sid = c.submit(serving(llama, lid, 30, pp=2, dp=2, seqs=2, queue=0))
    check("llama pp=2 dp=2: serving", wait_serving(c, sid), c.job(sid))
    st, r = generate(c, sid, {"prompt": PROMPTS[:3], "max_tokens": 4, "temperature": 0.5, "seed": 4})
    want = [ol(p, 4, 0.5, 0, 1, 4) for p in PROMPTS[:3]]
    check("llama: three prompts over two replicas equal the oracle",
          st == 200 and [x["tokens"] for x in r["results"]] == want, (st, r, want))
    st, r = generate(c, sid, {"prompt": PROMPTS[:5], "max_tokens": 4})
    check("more prompts than the job takes: 429 naming serve.max_queue",
          st == 429 and r["error"]["path"] == "serve.max_queue", (st, r))
    # 65 prompts: refused before any sequence exists (its error path once freed them and crashed the coordinator)
    st, r = generate(c, sid, {"prompt": ["a"] * 65, "max_tokens": 1})
    check("65 prompts: 422 naming prompt, and the coordinator still answers",
          st == 422 and r["error"]["path"] == "prompt" and "at most 64" in r["error"]["message"]
          and c.job(sid)["state"] == "running", (st, r))
    res = concurrently([lambda i=i: generate(c, sid, {"prompt": PROMPTS[i], "max_tokens": 5, "seed": i,
                                                      "temperature": 1.0}) for i in range(4)])
    bad = [(i, g) for i, g in enumerate(res) if g[0] != 200 or g[1]["results"][0]["tokens"] != ol(PROMPTS[i], 5, 1.0, 0, 1, i)]
    check("llama: four clients at once (one each per slot) equal the oracle", not bad, bad[:2])
    cancel(c, sid, 4, "llama pp=2 dp=2")

    d.close_cluster(c, tmp, check, lambda: check.failed)
    print(f"{check.passed} passed, {check.failed} failed")
    return 1 if check.failed else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""serve: a serve job's latency and throughput (docs/serving.md) against
the single-process oracle (`pipewright generate`) and a PyTorch KV-cache
decode (tests/ref/generate_ref.py), one thread each.

    /usr/bin/python3 bench/serve.py [--build DIR] [--pp N] [--tokens N] [--prompt-len N] [--rounds N]

The model is bench/jobs/gpt-d256.json's GPT (d=256, 4 layers, byte
vocabulary, seq_len 256) at its initial parameters, uploaded as stored
weights and served by a coordinator and pp workers on loopback
(OPENBLAS_NUM_THREADS=1). Requests are greedy, a prompt of 32 bytes and
64 new tokens, streamed; each client measures its time to first token and
the gaps between tokens as the events arrive. At 1, pp and 4*pp
concurrent requests (a wave of that many, --rounds waves each) it prints
time to first token (p50), inter-token latency (p50, p99) and aggregate
decode tokens/s (new tokens after each request's first, over the wave's
span from the first first-token to the last token), and the same over
whole (non-streamed) answers; then the oracle's and PyTorch's tokens/s on
one sequence (the oracle serves one at a time: that is its aggregate) and
the ratio of the serve job's at 2*pp concurrent requests to the oracle's,
paired by round (the oracle runs right before each wave, under the same
load) with its median and range. Every served output is checked against the
oracle's. A measurement on a machine that may be shared: `uptime` is
printed with the figures, and the linear layers' kernel path (the oracle's,
which the workers on this host take too: docs/serving.md) in the header.
"""
import argparse, atexit, http.client, json, os, shutil, statistics, subprocess, sys, tempfile, threading, time, urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
sys.path.insert(0, os.path.join(ROOT, "tests", "ref"))
sys.path.insert(0, HERE)
import driver as D  # noqa: E402
import generate  # noqa: E402  (bench/generate.py: the model, PyTorch's decode)


def stream(port, jid, body):
    """[(event time, token)] of one streamed request, and its start time."""
    h = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.perf_counter()
    h.request("POST", f"/v1/jobs/{jid}/generate", json.dumps(dict(body, stream=True)),
              {"Content-Type": "application/json"})
    r = h.getresponse()
    out, ev = [], None
    while True:
        line = r.readline()
        if not line:
            break
        line = line.decode().rstrip("\n")
        if line.startswith("event: "):
            ev = line[7:]
        elif line.startswith("data: ") and ev is None:
            out.append((time.perf_counter(), json.loads(line[6:])["token"]))
        elif not line:
            ev = None
    h.close()
    return t0, out


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] if xs else float("nan")


def whole(port, jid, body):
    """(start, end, tokens) of one request answered as one JSON object."""
    t0 = time.perf_counter()
    st, r = D.http(f"http://127.0.0.1:{port}", f"/v1/jobs/{jid}/generate", "POST", body, timeout=600)
    return t0, time.perf_counter(), r["results"][0]["tokens"] if st == 200 else r


def wave(port, jid, n, body, fn=stream):
    res = [None] * n

    def run(i):
        res[i] = fn(port, jid, body)
    ts = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--pp", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    pw = os.path.join(a.build, "pipewright")
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    tmp = tempfile.mkdtemp(prefix="pw-bench-serve-")
    atexit.register(shutil.rmtree, tmp, True)  # ranks' state and checkpoints: gigabytes
    job, jpath, ckpt = generate.d256(tmp, pw, env)
    prompt = open(os.path.join(ROOT, "examples/data/corpus.txt"), "rb").read(a.prompt_len)
    ids = ",".join(map(str, prompt))

    # the oracle: one sequence, its own tokens/s line
    def oracle_once():
        """The oracle's decode tokens/s on one sequence, and its tokens."""
        r = subprocess.run([pw, "generate", "--job", jpath, "--checkpoint", ckpt, "--prompt-tokens", ids,
                            "--max-tokens", str(a.tokens)], capture_output=True, text=True, env=env, check=True)
        ms = float(r.stderr.split("decode steps")[1].split("ms")[0])
        oracle_once.path = r.stderr.split("(linears: ")[-1].split(")\n")[0]
        return (a.tokens - 1) / ms * 1e3, [int(t) for t in r.stdout.strip().split(",")]

    rates = [oracle_once()[0] for _ in range(a.rounds)]
    oracle, want = statistics.median(rates), oracle_once()[1]

    generate.torch.set_num_threads(1)
    cfg = generate.R.job_config(job)
    P, _ = generate.R.load_params(cfg, ckpt)
    generate.G.generate(P, cfg, list(prompt), a.tokens, generate.G.Sampler())  # warm-up
    tr = []
    for _ in range(a.rounds):
        t0 = time.perf_counter()
        generate.G.generate(P, cfg, list(prompt), a.tokens, generate.G.Sampler())
        tr.append(a.tokens / (time.perf_counter() - t0))
    torch_rate = statistics.median(tr)

    c = D.Cluster(a.build, tmp, "bench", data_root=ROOT)
    for i in range(a.pp):
        c.start_worker(f"w{i}")
    c.wait_idle(a.pp)
    req = urllib.request.Request(c.base + "/v1/checkpoints", data=open(ckpt, "rb").read(), method="POST",
                                 headers={"Content-Type": "application/octet-stream"})
    wid = json.loads(urllib.request.urlopen(req).read())["id"]
    n_max = 4 * a.pp
    sv = dict(job, name="bench-serve", mode="serve", mesh={"pp": a.pp, "dp": 1}, init={"checkpoint": wid},
              serve={"max_sequences": n_max, "max_len": a.prompt_len + a.tokens, "max_queue": n_max},
              schedule={"name": "gpipe", "microbatches": a.pp}, train=dict(job["train"], batch_size=a.pp))
    sv["data"] = dict(job["data"])
    jid = c.submit(sv)
    D.wait_for(lambda: c.job(jid).get("status") == "serving", 120)
    body = {"prompt": list(prompt), "max_tokens": a.tokens}
    wave(c.http_port, jid, 1, body)  # warm-up
    up = open("/proc/loadavg").read().split()[:3]
    print(f"d256 L4 gpt, prompt {a.prompt_len}, {a.tokens} new tokens, greedy; serve job pp={a.pp}, 1 thread per "
          f"worker; linears {oracle_once.path}; load average before: {' '.join(up)}")
    print(f"{'concurrent':>10} {'ttft p50 ms':>12} {'itl p50 ms':>11} {'itl p99 ms':>11} {'decode tok/s':>13}"
          f" {'tok/s, json':>12}")
    agg, agg_json, ok, paired = {}, {}, True, []
    for n in sorted({1, a.pp, 2 * a.pp, 4 * a.pp}):
        ttft, itl, rate = [], [], []
        for _ in range(a.rounds):
            base = oracle_once()[0] if n == 2 * a.pp else None  # paired: the same moment's load
            res = wave(c.http_port, jid, n, body)
            ok &= all([t for _, t in ev] == want for _, ev in res)
            first = min(ev[0][0] for _, ev in res)
            last = max(ev[-1][0] for _, ev in res)
            rate.append(sum(len(ev) - 1 for _, ev in res) / (last - first))
            if base:
                paired.append(rate[-1] / base)
            for t0, ev in res:
                ttft.append(ev[0][0] - t0)
                itl += [b[0] - a_[0] for a_, b in zip(ev, ev[1:])]
        agg[n] = statistics.median(rate)
        whole_rate = []
        for _ in range(a.rounds):
            res = wave(c.http_port, jid, n, body, whole)
            ok &= all(t == want for _, _, t in res)
            whole_rate.append(n * a.tokens / (max(e for _, e, _ in res) - min(s_ for s_, _, _ in res)))
        agg_json[n] = statistics.median(whole_rate)
        print(f"{n:>10} {1e3 * pct(ttft, 50):>12.2f} {1e3 * pct(itl, 50):>11.2f} {1e3 * pct(itl, 99):>11.2f} "
              f"{agg[n]:>13.0f} {agg_json[n]:>12.0f}")
    print(f"oracle (pipewright generate, one sequence): {oracle:.0f} decode tokens/s; "
          f"PyTorch KV cache: {torch_rate:.0f} tokens/s")
    print(f"serve pp={a.pp} at {2 * a.pp} concurrent / oracle, paired by round: {statistics.median(paired):.2f}x "
          f"(range {min(paired):.2f}-{max(paired):.2f}; target 1.6x at pp=2); answered whole, against the median "
          f"oracle: {agg_json[2 * a.pp] / oracle:.2f}x")
    print("served tokens equal the oracle's:", "yes" if ok else "NO")
    print("uptime:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    D.http(c.base, f"/v1/jobs/{jid}", "DELETE")
    c.stop()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

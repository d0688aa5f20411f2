#!/usr/bin/env python3
"""test_serve_text: a job that names its tokenizer (data.tokenizer, issue
34) takes and returns text on the coordinator — a real coordinator and two
workers on loopback, the example tokenizer (examples/data/tokenizer.json,
2048 ids, byte-level BPE).

  1. The corpus tokenized with `pipewright tokenize --out`; a pp 2 GPT of
     vocab 2048 trained on it through `pipewright submit`, whose job file
     names the tokens file and the tokenizer by path: the CLI stores both
     as datasets and the job names their ids.
  2. A serve job of its checkpoint with that data.tokenizer: a prompt
     given as text is encoded with the tokenizer (the tokens equal those of
     the same prompt given as `pipewright tokenize`'s ids), and each answer
     carries text, `pipewright tokenize --decode --skip-special` of its
     tokens; a list of text prompts too.
  3. Bad input, each a 422 at data.tokenizer naming why and nothing queued:
     a stored dataset that is not a tokenizer (the corpus), a tokenizer of
     more ids than model.vocab_size, a path the coordinator cannot read
     (only ids are stored), a tokenizer on a job of kind text (bytes are
     its tokens); the tokenizer's dataset cannot be deleted while a job
     that names it is live (409).

Usage: test_serve_text.py BUILD_DIR SOURCE_DIR"""
import json, os, subprocess, sys, tempfile

BUILD, SRC = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import driver as d  # noqa: E402

TOK = os.path.join(SRC, "examples/data/tokenizer.json")
PW = os.path.join(BUILD, "pipewright")
check = d.Checks()


def run(*args, stdin=None):
    return subprocess.run([PW, *args], input=stdin, capture_output=True, text=True, timeout=120)


def spec(name, data, vocab=2048):
    return {"name": name,
            "model": {"template": "gpt", "vocab_size": vocab, "seq_len": 32, "d_model": 32, "n_layers": 2,
                      "n_heads": 2},
            "mesh": {"pp": 2}, "schedule": {"name": "1f1b", "microbatches": 2},
            "train": {"steps": 20, "batch_size": 4, "seed": 3, "checkpoint_every": 20,
                      "optimizer": {"name": "adamw", "lr": 1e-2}},
            "data": data}


def main():
    tmp = tempfile.mkdtemp(prefix="pw-stext-")
    toks = os.path.join(tmp, "corpus.tok")
    p = run("tokenize", "--tokenizer", TOK, "--in", os.path.join(SRC, "examples/data/corpus.txt"), "--out", toks)
    check("pipewright tokenize --out writes the corpus's token file", p.returncode == 0 and os.path.getsize(toks) > 0,
          p.stderr)
    c = d.Cluster(BUILD, tmp, "st", data_root=tmp)
    for n in ("a", "b"):
        c.start_worker(n)
    check("two workers idle", c.wait_idle(2))

    # 1. train, the files named by path
    jf = os.path.join(tmp, "train.json")
    json.dump(spec("tok-train", {"kind": "tokens", "path": toks, "tokenizer": TOK}), open(jf, "w"))
    p = run("submit", "--job", jf, "--coordinator", c.base)
    check("pipewright submit stores the tokenizer as a dataset and says so",
          p.returncode == 0 and "data.tokenizer" in p.stdout and "as dataset" in p.stdout, p.stdout + p.stderr)
    st, jobs = d.http(c.base, "/v1/jobs")
    jid = jobs["jobs"][0]["id"] if st == 200 and jobs.get("jobs") else 0
    j = c.wait_job(jid, 300)
    check("the job trains on the tokens to success", j.get("state") == "succeeded", j)
    tok_id = ((j.get("spec") or {}).get("data") or {}).get("tokenizer", "")
    check("the stored job names the tokenizer by its dataset id", len(tok_id) == 64, j.get("spec"))

    # 2. serve it: text in, text out
    sv = spec("tok-serve", {"kind": "tokens", "dataset": j["spec"]["data"]["dataset"], "tokenizer": tok_id})
    sv.update(mode="serve", init={"job": jid, "step": 20}, serve={"max_sequences": 4, "max_len": 32, "max_queue": 8})
    del sv["train"]
    sid = c.submit(sv)
    check("the serve job runs", d.wait_for(lambda: c.job(sid).get("state") == "running", 120, 0.1), c.job(sid))
    prompt = "Once upon a time"
    ids = [int(x) for x in run("tokenize", "--tokenizer", TOK, stdin=prompt).stdout.split()]
    st1, r1 = d.http(c.base, f"/v1/jobs/{sid}/generate", "POST", {"prompt": prompt, "max_tokens": 8})
    st2, r2 = d.http(c.base, f"/v1/jobs/{sid}/generate", "POST", {"prompt": ids, "max_tokens": 8})
    ok = st1 == 200 and st2 == 200
    a, b = (r1["results"][0] if ok else {}), (r2["results"][0] if ok else {})
    check("a text prompt is the tokenizer's ids: the same tokens as those ids given", ok and
          a.get("prompt_tokens") == len(ids) and a.get("tokens") == b.get("tokens") and len(a["tokens"]) == 8,
          (st1, r1, st2, r2))
    dec = run("tokenize", "--tokenizer", TOK, "--decode", "--skip-special",
              stdin=" ".join(str(t) for t in a.get("tokens", []))).stdout
    check("the answer's text is its tokens decoded", ok and a.get("text") == dec and b.get("text") == dec,
          (a.get("text"), dec))
    st, r = d.http(c.base, f"/v1/jobs/{sid}/generate", "POST", {"prompt": ["The ", "He said"], "max_tokens": 4})
    check("a list of text prompts: an answer with text each", st == 200 and len(r.get("results", [])) == 2 and
          all(isinstance(x.get("text"), str) for x in r["results"]), (st, r))

    # 3. bad input
    def refused(sp, why):
        st, r = d.http(c.base, "/v1/jobs", "POST", sp)
        e = r.get("error") or {} if isinstance(r, dict) else {}
        return st == 422 and e.get("path") == "data.tokenizer" and why in e.get("message", ""), (st, r)
    corpus_id = j["spec"]["data"]["dataset"]
    ok, det = refused(spec("bad1", {"kind": "tokens", "dataset": corpus_id, "tokenizer": corpus_id}),
                      "is not a tokenizer this coordinator reads")
    check("a dataset that is not a tokenizer: 422 at data.tokenizer", ok, det)
    bytes_tok = os.path.join(tmp, "bytes.tok")  # vocab 256: the data fits a model of 1000 ids, the tokenizer not
    run("dataset", "convert", os.path.join(SRC, "examples/data/corpus.txt"), bytes_tok)
    ok, det = refused(spec("bad2", {"kind": "tokens", "path": bytes_tok, "tokenizer": tok_id}, vocab=1000),
                      "the tokenizer has 2048 ids")
    check("a tokenizer of more ids than model.vocab_size: 422 naming both", ok and "1000" in str(det), det)
    ok, det = refused(spec("bad3", {"kind": "tokens", "dataset": corpus_id, "tokenizer": TOK}),
                      "must be a stored dataset's id")
    check("a path sent to the coordinator: 422 saying to upload it", ok, det)
    st, r = d.http(c.base, "/v1/jobs", "POST", spec("bad4", {"kind": "text", "dataset": corpus_id,
                                                             "tokenizer": tok_id}))
    check("a tokenizer on a text job (bytes are its tokens): 422 at data.tokenizer",
          st == 422 and "data.tokenizer" in json.dumps(r), (st, r))
    st, jobs = d.http(c.base, "/v1/jobs")
    check("nothing was queued by them", st == 200 and len(jobs.get("jobs", [])) == 2, jobs)
    st, r = d.http(c.base, f"/v1/datasets/{tok_id}", "DELETE")
    check("the tokenizer's dataset cannot be deleted while the serve job lives: 409", st == 409, (st, r))

    d.stop_checked(c, check)
    return d.finish(tmp, check)


if __name__ == "__main__":
    try:
        sys.exit(main())
    finally:
        d._kill_all()

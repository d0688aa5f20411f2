#!/usr/bin/env python3
"""test_init_weights: stored weights and "init", end to end.

A real coordinator and two real workers (pp=2) on 127.0.0.1. Asserts:
  - POST /v1/checkpoints stores a safetensors file under its sha256 (201,
    then 200 for the same bytes), lists it, serves its bytes to the cluster
    token; a file that is not safetensors, or holds a NaN, is refused (400)
    naming what is wrong, and nothing is listed for it;
  - a job whose model does not match the weights is refused (422 at "init"
    naming the tensor and both shapes), as are an unknown id and an unknown
    job or step; nothing is queued for them;
  - a pp=2 job initialised from the uploaded file ends with parameters equal
    bit for bit to `pipewright train --init FILE` of the same spec;
  - init {"job", "step"} gathers that job's retained step into stored weights
    (the submitted job names them by sha256; their bytes are the job's
    gathered checkpoint), with "optimizer": true its optimizer state too;
  - DELETE answers 409 while a queued job uses the weights, 200 after.
"""
import hashlib, json, os, shutil, struct, subprocess, sys, tempfile, time, urllib.error, urllib.request

BUILD, SRC = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
TOKEN = "cluster-secret-for-init"
FAILS = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        FAILS.append(what)
    return cond


def request(method, url, body=None, ctype=None, token=None):
    req = urllib.request.Request(url, data=body, method=method)
    if ctype:
        req.add_header("Content-Type", ctype)
    if token:
        req.add_header("Authorization", "Bearer " + token)
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.read(), dict(r.getheaders())
    except urllib.error.HTTPError as e:
        return e.code, e.read(), dict(e.headers)


def tensors(blob):
    """{name: (dtype, shape, bytes)} of a safetensors file's bytes."""
    n = struct.unpack("<Q", blob[:8])[0]
    hdr = json.loads(blob[8:8 + n])
    hdr.pop("__metadata__", None)
    base = 8 + n
    return {k: (v["dtype"], v["shape"], blob[base + v["data_offsets"][0]:base + v["data_offsets"][1]])
            for k, v in hdr.items()}


def st_bytes(ts):
    """A safetensors file of float32 tensors {name: (shape, [values])}."""
    hdr, data = {}, b""
    for k, (shape, vals) in sorted(ts.items()):
        b = struct.pack("<%df" % len(vals), *vals)
        hdr[k] = {"dtype": "F32", "shape": shape, "data_offsets": [len(data), len(data) + len(b)]}
        data += b
    h = json.dumps(hdr).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def spec(d=32, pp=2, dp=1, steps=3, seed=5, init=None, name="init"):
    j = {"name": name,
         "model": {"template": "gpt", "vocab_size": 64, "seq_len": 16, "d_model": d, "n_layers": 2, "n_heads": 2},
         "mesh": {"pp": pp, "dp": dp}, "schedule": {"name": "1f1b", "microbatches": 2},
         "train": {"steps": steps, "batch_size": 4, "seed": seed, "checkpoint_every": 0},
         "data": {"kind": "copy"}}
    if init is not None:
        j["init"] = init
    return j


def wait_job(base, jid, timeout=240):
    end, job = time.time() + timeout, {}
    while time.time() < end:
        job = json.loads(request("GET", f"{base}/v1/jobs/{jid}")[1])
        if job.get("state") in ("succeeded", "failed", "cancelled"):
            break
        time.sleep(0.3)
    return job


def n_jobs(base):
    return json.loads(request("GET", base + "/v1/jobs")[1])["total"]


def main():
    for exe in ("pipewright", "pipewright-worker", "pipewright-coordinator"):
        if not os.access(os.path.join(BUILD, exe), os.X_OK):
            print(f"SKIP test_init_weights: no {exe} in {BUILD}")
            return 77
    tmp = tempfile.mkdtemp(prefix="pw-init-")
    tok = os.path.join(tmp, "cluster.token")
    open(tok, "w").write(TOKEN + "\n")
    os.chmod(tok, 0o600)
    ready = os.path.join(tmp, "ready.json")
    procs = []
    coord = subprocess.Popen([os.path.join(BUILD, "pipewright-coordinator"), "--http", "127.0.0.1:0", "--control",
                              "127.0.0.1:0", "--state-dir", os.path.join(tmp, "coord"), "--ready-file", ready,
                              "--cluster-token-file", tok], stdout=open(os.path.join(tmp, "coordinator.log"), "w"),
                             stderr=subprocess.STDOUT)
    try:
        for _ in range(400):
            if os.path.exists(ready) or coord.poll() is not None:
                break
            time.sleep(0.05)
        if not check(os.path.exists(ready), "the coordinator starts"):
            return 1
        ports = json.load(open(ready))
        base = f"http://127.0.0.1:{ports['http']}"
        for i in range(2):
            procs.append(subprocess.Popen(
                [os.path.join(BUILD, "pipewright-worker"), "--coordinator", f"127.0.0.1:{ports['control']}",
                 "--listen", "127.0.0.1:0", "--name", f"w{i}", "--state-dir", os.path.join(tmp, f"w{i}"),
                 "--token-file", tok], stdout=open(os.path.join(tmp, f"w{i}.log"), "w"), stderr=subprocess.STDOUT))

        # the weights: the model's initial parameters under another seed
        job_file = os.path.join(tmp, "job.json")
        json.dump(spec(), open(job_file, "w"))
        seed_file = os.path.join(tmp, "seed9.json")
        json.dump(spec(seed=9), open(seed_file, "w"))
        wfile = os.path.join(tmp, "w.safetensors")
        subprocess.run([os.path.join(BUILD, "pipewright"), "train", "--job", seed_file, "--steps", "0", "--out", wfile,
                        "--quiet"], check=True, env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
        blob = open(wfile, "rb").read()
        ck = hashlib.sha256(blob).hexdigest()

        st, body, hd = request("POST", base + "/v1/checkpoints?name=seed9", blob, "application/octet-stream")
        row = json.loads(body)
        check(st == 201 and row.get("id") == ck and row.get("name") == "seed9" and row.get("kind") == "model",
              f"upload stores the weights under their sha256 ({st} {body[:200]})")
        check(hd.get("Location") == f"/v1/checkpoints/{ck}", "the answer's Location names them")
        st, body, _ = request("POST", base + "/v1/checkpoints", blob, "application/octet-stream")
        check(st == 200 and json.loads(body)["id"] == ck, f"the same bytes again: 200, the same id ({st})")
        check(os.path.exists(os.path.join(tmp, "coord", "weights", ck)), "the file is <state_dir>/weights/<sha256>")
        st, body, _ = request("GET", f"{base}/v1/checkpoints/{ck}/content", token=TOKEN)
        check(st == 200 and body == blob, f"the cluster token reads the bytes ({st})")
        st, body, _ = request("POST", base + "/v1/checkpoints", b"not a safetensors file at all",
                              "application/octet-stream")
        check(st == 400 and b"safetensors" in body, f"a file that is not safetensors is refused ({st} {body[:200]})")
        nan = st_bytes({"a": ([2], [1.0, float("nan")])})
        st, body, _ = request("POST", base + "/v1/checkpoints", nan, "application/octet-stream")
        check(st == 400 and b"'a'" in body and b"non-finite" in body, f"a NaN is refused naming the tensor ({st} {body[:200]})")
        lst = json.loads(request("GET", base + "/v1/checkpoints")[1])["checkpoints"]
        check([c["id"] for c in lst] == [ck], f"only the good file is listed ({len(lst)})")
        left = [f for f in os.listdir(os.path.join(tmp, "coord", "weights")) if f != ck]
        check(not left, f"refused uploads leave no file ({left})")

        # refused at submit: nothing queued
        before = n_jobs(base)
        st, body, _ = request("POST", base + "/v1/jobs", json.dumps(spec(d=48, init={"checkpoint": ck})).encode(),
                              "application/json")
        e = json.loads(body).get("error", {})
        m = e.get("message", "")
        check(st == 422 and e.get("path") == "init" and "'embed.tok.weight'" in m and "[64, 48]" in m and "[64, 32]" in m,
              f"a model of another width: 422 at init naming the tensor and both shapes ({st} {e})")
        st, body, _ = request("POST", base + "/v1/jobs", json.dumps(spec(init={"checkpoint": "0" * 64})).encode(),
                              "application/json")
        check(st == 422 and json.loads(body)["error"]["path"] == "init.checkpoint", f"an unknown id: 422 ({st})")
        st, body, _ = request("POST", base + "/v1/jobs", json.dumps(spec(init={"job": 999, "step": 1})).encode(),
                              "application/json")
        check(st == 422 and json.loads(body)["error"]["path"] == "init.job", f"an unknown job: 422 ({st} {body[:200]})")
        st, body, _ = request("POST", base + "/v1/jobs",
                              json.dumps(spec(init={"checkpoint": ck, "optimizer": True})).encode(), "application/json")
        check(st == 422 and json.loads(body)["error"]["path"] == "init.optimizer", f"optimizer without job+step: 422 ({st})")
        check(n_jobs(base) == before, "nothing was queued for them")

        # the cluster job from the uploaded file equals `pipewright train --init`, bit for bit
        st, body, _ = request("POST", base + "/v1/jobs", json.dumps(spec(init={"checkpoint": ck})).encode(),
                              "application/json")
        check(st == 201, f"a job initialised from the weights is accepted ({st} {body[:300]})")
        jid = json.loads(body)["id"]
        job = wait_job(base, jid)
        check(job.get("state") == "succeeded", f"it succeeds ({job.get('state')}: {job.get('error')})")
        check(job.get("spec", {}).get("init") == {"checkpoint": ck}, f"its spec names the weights ({job.get('spec', {}).get('init')})")
        st, got, hd = request("GET", f"{base}/v1/jobs/{jid}/checkpoint")
        ref = os.path.join(tmp, "ref.safetensors")
        subprocess.run([os.path.join(BUILD, "pipewright"), "train", "--job", job_file, "--init", wfile, "--out", ref,
                        "--quiet"], check=True, env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
        a, b = tensors(got) if st == 200 else {}, tensors(open(ref, "rb").read())
        diff = sorted(k for k in b if a.get(k) != b[k])
        check(st == 200 and a.keys() == b.keys() and not diff,
              f"its final parameters equal `pipewright train --init` bit for bit ({st}; differ: {diff[:5]})")
        seed_ref = os.path.join(tmp, "seedref.safetensors")
        subprocess.run([os.path.join(BUILD, "pipewright"), "train", "--job", job_file, "--out", seed_ref, "--quiet"],
                       check=True, env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
        check(tensors(open(seed_ref, "rb").read()) != b, "(and differ from the same job without init)")
        for i in range(2):
            cached = os.path.join(tmp, f"w{i}", "cache", "datasets", ck)
            check(os.path.exists(cached) and open(cached, "rb").read() == blob,
                  f"worker {i} fetched the weights into its cache")

        # init from a job's retained step
        cd = hd.get("Content-Disposition", "")
        step = int(cd.split("step-")[1].split(".")[0]) if "step-" in cd else -1
        st, body, _ = request("POST", base + "/v1/jobs",
                              json.dumps(spec(init={"job": jid, "step": step + 1000})).encode(), "application/json")
        check(st == 422 and json.loads(body)["error"]["path"] == "init.step", f"a step not retained: 422 ({st} {body[:200]})")
        st, body, _ = request("POST", base + "/v1/jobs",
                              json.dumps(spec(dp=2, init={"job": jid, "step": step, "optimizer": True})).encode(),
                              "application/json")
        check(st == 201, f"init from job {jid} step {step} with its optimizer is accepted ({st} {body[:300]})")
        j2 = json.loads(body).get("id")
        init = json.loads(request("GET", f"{base}/v1/jobs/{j2}")[1]).get("spec", {}).get("init", {})
        gathered = init.get("checkpoint", "")
        check(gathered and gathered != ck and init.get("job") == jid and init.get("step") == step and
              init.get("optimizer_checkpoint"), f"it names the gathered weights by sha256 ({init})")
        st, gb, _ = request("GET", f"{base}/v1/checkpoints/{gathered}/content")
        check(st == 200 and hashlib.sha256(gb).hexdigest() == gathered and tensors(gb) == a,
              "the gathered weights are the job's checkpoint at that step")
        st, ob, _ = request("GET", f"{base}/v1/checkpoints/{init.get('optimizer_checkpoint')}/content")
        check(st == 200 and any(k.startswith("exp_avg.") for k in tensors(ob)) and
              any(k.startswith("exp_avg_sq.") for k in tensors(ob)), "and its optimizer state (exp_avg.*, exp_avg_sq.*)")
        # that pp=2 x dp=2 job waits for 4 workers: the weights are in use
        st, body, _ = request("DELETE", f"{base}/v1/checkpoints/{gathered}")
        check(st == 409 and str(j2).encode() in body, f"DELETE while a queued job uses them: 409 naming it ({st} {body[:200]})")
        request("DELETE", f"{base}/v1/jobs/{j2}")
        st, body, _ = request("DELETE", f"{base}/v1/checkpoints/{gathered}")
        check(st == 200, f"DELETE once it is cancelled: 200 ({st} {body[:200]})")
        check(request("GET", f"{base}/v1/checkpoints/{gathered}")[0] == 404, "then it is gone (404)")
        check(not os.path.exists(os.path.join(tmp, "coord", "weights", gathered)), "and so is its file")
    finally:
        for p in procs + [coord]:
            if p.poll() is None:
                p.terminate()
        for p in procs + [coord]:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        if not FAILS:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print("kept", tmp)
    print("test_init_weights:", "FAILED: " + "; ".join(FAILS) if FAILS else "ok")
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())

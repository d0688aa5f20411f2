#!/usr/bin/env python3
"""test_datasets: datasets as managed objects, over real HTTP to a real
pipewright-coordinator (API token and cluster token set, --data-root given).

  1. Upload (201), the same bytes again (200, same id), list, one, content
     (equal to the bytes, with the API token and with the cluster token; the
     cluster token opens nothing else); a token file's header in the row.
  2. A job reading the dataset is queued (no worker is connected); DELETE
     is refused (409 naming the job) until the job is cancelled.
  3. Submit with data.path: traversal, a symlink out of the root, an
     absolute path outside, a missing file, a directory, an unknown
     data.dataset, a token dataset over the model's vocabulary: each a 422
     naming the field (and for paths the path and the root), and
     GET /v1/jobs unchanged. An accepted path is imported: the stored spec
     names data.dataset (the file's sha256) and no path. A coordinator
     without --data-root refuses every path, saying so.
  3b. The same path swapped while submissions run (a thread renames a
     symlink out of the root, or a FIFO, over a file under it, over and
     over): no job ever imports the outside file, every submission answers
     (201 or 422) and none holds a pool thread; the API plans afterwards.
  4. welcome.http_url: a worker registering on the control port is told the
     API's URL.
  5. A 1 GiB upload, generated as it is sent: stored with the right sha256
     while the coordinator's RSS (VmHWM against VmRSS before) grows by less
     than 64 MiB. Needs ~1.1 GiB free under TMPDIR; PW_TEST_SKIP_1GIB=1
     skips it (and only that part) when the disk is short.
Usage: test_datasets.py BUILD_DIR SOURCE_DIR"""
import hashlib, http.client, json, os, shutil, socket, struct, subprocess, sys, tempfile, time

import driver

BUILD, SRC = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
TOKEN, CLUSTER = "ds-api-token", "ds-cluster-token"
SPEC = {"name": "ds", "model": {"template": "gpt", "vocab_size": 256, "seq_len": 8, "d_model": 16, "n_layers": 2,
                               "n_heads": 2},
        "mesh": {"pp": 2}, "schedule": {"name": "1f1b", "microbatches": 2},
        "train": {"steps": 4, "batch_size": 4}}
failures = []


def check(label, ok, detail=""):
    print(("ok   " if ok else "FAIL ") + label + ("" if ok else f": {detail}"))
    if not ok:
        failures.append(label)
    return ok


class Api:
    def __init__(self, port):
        self.port = port

    def call(self, method, path, body=None, token=TOKEN, headers=None, timeout=120):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        hd = dict(headers or {})
        if token:
            hd["Authorization"] = "Bearer " + token
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
            hd["Content-Type"] = "application/json"
        elif isinstance(body, bytes):
            hd["Content-Type"] = "application/octet-stream"
        conn.request(method, path, body=body, headers=hd)
        r = conn.getresponse()
        data = r.read()
        hs = {k.lower(): v for k, v in r.getheaders()}
        conn.close()
        if hs.get("content-type", "").startswith("application/json"):
            data = json.loads(data)
        return r.status, data, hs


def start(tmp, name, extra):
    state, ready = os.path.join(tmp, name), os.path.join(tmp, name + ".ready")
    for f, t in (("token", TOKEN), ("cluster", CLUSTER)):
        with open(os.open(os.path.join(tmp, f), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as fh:
            fh.write(t + "\n")
    log = open(os.path.join(tmp, name + ".log"), "w")
    p = subprocess.Popen([os.path.join(BUILD, "pipewright-coordinator"), "--http", "127.0.0.1:0", "--control",
                          "127.0.0.1:0", "--state-dir", state, "--ready-file", ready, "--token-file",
                          os.path.join(tmp, "token"), "--cluster-token-file", os.path.join(tmp, "cluster")] + extra,
                         stdout=log, stderr=subprocess.STDOUT)
    t = time.time() + 30
    while not os.path.exists(ready):
        if p.poll() is not None or time.time() > t:
            raise SystemExit("the coordinator did not start: " + open(log.name).read()[-2000:])
        time.sleep(0.05)
    return p, json.load(open(ready)), log.name


def stop(p):
    p.terminate()
    try:
        p.wait(20)
    except subprocess.TimeoutExpired:
        p.kill()


def token_file(vocab, ids):
    return b"PWTOKENS" + struct.pack("<IIIIQ", 1, 2, vocab, 0, len(ids)) + struct.pack(f"<{len(ids)}H", *ids)


def jobs_total(api):
    return api.call("GET", "/v1/jobs")[1]["total"]


def uploads_left(state):
    d = os.path.join(state, "datasets")
    return [f for f in os.listdir(d) if f.startswith(".upload-")] if os.path.isdir(d) else []


def crud(api, state):
    body = b"the quick brown fox jumps over the lazy dog\n" * 40
    sha = hashlib.sha256(body).hexdigest()
    st, ds, hs = api.call("POST", "/v1/datasets?name=fox", body)
    check("upload -> 201", st == 201 and ds["id"] == sha and ds["sha256"] == sha and ds["size"] == len(body)
          and ds["format"] == "text" and ds["name"] == "fox" and hs.get("location") == "/v1/datasets/" + sha,
          (st, ds, hs))
    st, again, _ = api.call("POST", "/v1/datasets?name=other", body)
    check("the same bytes again -> 200, the same dataset", st == 200 and again == ds, (st, again))
    st, lst, _ = api.call("GET", "/v1/datasets")
    check("list", st == 200 and [d["id"] for d in lst["datasets"]].count(sha) == 1, lst)
    st, one, _ = api.call("GET", "/v1/datasets/" + sha)
    check("get one", st == 200 and one == ds, one)
    st, data, hs = api.call("GET", f"/v1/datasets/{sha}/content")
    check("content with the API token equals the bytes", st == 200 and data == body, (st, len(data)))
    st, data, _ = api.call("GET", f"/v1/datasets/{sha}/content", token=CLUSTER)
    check("content with the cluster token equals the bytes", st == 200 and data == body, st)
    st, _, _ = api.call("GET", "/v1/datasets", token=CLUSTER)
    check("the cluster token opens nothing else (401)", st == 401, st)
    st, _, _ = api.call("GET", f"/v1/datasets/{sha}/content", token="wrong")
    check("content with a wrong token -> 401", st == 401, st)
    tok = token_file(200, [i % 200 for i in range(1000)])
    st, t, _ = api.call("POST", "/v1/datasets?name=toks", tok)
    check("a token file -> 201 with its header", st == 201 and t["format"] == "tokens" and t["vocab_size"] == 200
          and t["width"] == 2 and t["n_tokens"] == 1000, (st, t))
    bad = token_file(200, [5] * 10 + [250] + [5] * 10)
    st, err, _ = api.call("POST", "/v1/datasets", bad)
    check("a token file with an id over its vocabulary -> 400 naming it", st == 400 and "10" in
          err["error"]["message"] and "250" in err["error"]["message"], (st, err))
    check("no upload file is left behind", not uploads_left(state), uploads_left(state))
    return ds, t


def in_use(api, ds):
    before = jobs_total(api)
    st, made, _ = api.call("POST", "/v1/jobs", dict(SPEC, data={"kind": "text", "dataset": ds["id"]}))
    check("a job reading the dataset is queued", st == 201, (st, made))
    st, err, _ = api.call("DELETE", "/v1/datasets/" + ds["id"])
    check("DELETE while a queued job uses it -> 409 naming the job",
          st == 409 and err["error"]["code"] == "conflict" and f"job {made['id']}" in err["error"]["message"],
          (st, err))
    st, _, _ = api.call("DELETE", f"/v1/jobs/{made['id']}")
    check("the job is cancelled", st == 200, st)
    st, gone, _ = api.call("DELETE", "/v1/datasets/" + ds["id"])
    check("DELETE after the cancel -> 200", st == 200 and gone["id"] == ds["id"], (st, gone))
    st, _, _ = api.call("GET", "/v1/datasets/" + ds["id"])
    check("then it is gone (404)", st == 404, st)
    check("one job added in all", jobs_total(api) == before + 1)


def refusals(api, root, tok):
    os.makedirs(os.path.join(root, "subdir"), exist_ok=True)
    outside = tempfile.NamedTemporaryFile(prefix="pw-ds-outside-", delete=False)
    outside.write(b"not yours\n" * 10)
    outside.close()
    link = os.path.join(root, "escape.txt")
    if not os.path.lexists(link):
        os.symlink(outside.name, link)
    cases = [("../../etc/shadow", "data.path", "outside the data root"),
             ("escape.txt", "data.path", "outside the data root"),
             (outside.name, "data.path", "outside the data root"),
             ("nope.txt", "data.path", "no such file"),
             ("subdir", "data.path", "not a regular file")]
    before = jobs_total(api)
    for given, field, why in cases:
        st, err, _ = api.call("POST", "/v1/jobs", dict(SPEC, data={"kind": "text", "path": given}))
        e = err.get("error", {}) if isinstance(err, dict) else {}
        msg = e.get("message", "")
        check(f"data.path {given!r} -> 422 naming the path and the root", st == 422 and e.get("path") == field
              and given in msg and root in msg and why in msg, (st, err))
    # a token file whose header is wrong (version 9), and a text file given as tokens
    import struct
    with open(os.path.join(root, "bad.tok"), "wb") as f:
        f.write(b"PWTOKENS" + struct.pack("<IIIIQ", 9, 2, 256, 0, 100) + bytes(200))
    with open(os.path.join(root, "plain.txt"), "wb") as f:
        f.write(b"just text\n" * 100)
    for given, why in [("bad.tok", "version 9"), ("plain.txt", "not a token file")]:
        st, err, _ = api.call("POST", "/v1/jobs", dict(SPEC, data={"kind": "tokens", "path": given}))
        e = err.get("error", {}) if isinstance(err, dict) else {}
        check(f"kind tokens, data.path {given!r} -> 422 naming the path ({why})", st == 422 and
              e.get("path") == "data.path" and given in e.get("message", "") and why in e.get("message", ""),
              (st, err))
    st, err, _ = api.call("POST", "/v1/jobs", dict(SPEC, data={"kind": "text", "dataset": "ab" * 32}))
    check("an unknown data.dataset -> 422 at data.dataset", st == 422 and err["error"]["path"] == "data.dataset",
          (st, err))
    small = dict(SPEC, model=dict(SPEC["model"], vocab_size=100))
    st, err, _ = api.call("POST", "/v1/jobs", dict(small, data={"kind": "tokens", "dataset": tok["id"]}))
    check("a token dataset over the model's vocabulary -> 422", st == 422 and "200" in err["error"]["message"]
          and "100" in err["error"]["message"], (st, err))
    check("nothing was queued by the refusals", jobs_total(api) == before, (jobs_total(api), before))
    os.unlink(outside.name)

    corpus = os.path.join(root, "corpus.txt")
    with open(corpus, "wb") as f:
        f.write(b"a corpus under the root\n" * 200)
    sha = hashlib.sha256(open(corpus, "rb").read()).hexdigest()
    st, made, _ = api.call("POST", "/v1/jobs", dict(SPEC, data={"kind": "text", "path": "corpus.txt"}))
    check("a path under the root is accepted", st == 201, (st, made))
    if st == 201:
        job = api.call("GET", f"/v1/jobs/{made['id']}")[1]
        data = job["spec"]["data"]
        check("the stored spec names data.dataset (the sha256), no path", data.get("dataset") == sha and
              "path" not in data, data)
        st, one, _ = api.call("GET", "/v1/datasets/" + sha)
        check("the file was imported as a dataset", st == 200 and one["name"] == "corpus.txt", (st, one))
        api.call("DELETE", f"/v1/jobs/{made['id']}")


def races(api, root):
    """data.path swapped between a file under the root and a symlink out of it (or a FIFO) while jobs are
    submitted: what is imported is always the file under the root."""
    import threading
    outside = tempfile.NamedTemporaryFile(prefix="pw-ds-secret-", delete=False)
    outside.write(b"SECRET outside the root\n" * 50)
    outside.close()
    inside = b"inside the root\n" * 50
    target = os.path.join(root, "race.txt")
    for kind in ("symlink", "fifo"):
        stop_flag = threading.Event()

        def flip():
            reg, odd = os.path.join(root, ".race.reg"), os.path.join(root, ".race.odd")
            while not stop_flag.is_set():
                with open(reg, "wb") as f:
                    f.write(inside)
                os.replace(reg, target)
                time.sleep(0.002)  # mostly the file under the root: checks pass, then the swap lands after
                if os.path.lexists(odd):
                    os.unlink(odd)
                if kind == "symlink":
                    os.symlink(outside.name, odd)
                else:
                    os.mkfifo(odd)
                os.replace(odd, target)
                time.sleep(0.001)
        with open(target, "wb") as f:
            f.write(inside)
        t = threading.Thread(target=flip, daemon=True)
        t.start()
        answers, leaked, ids = {}, [], set()
        try:
            for i in range(40):
                try:  # (a FIFO opened for reading blocks until a writer comes: a request held)
                    st, made, _ = api.call("POST", "/v1/jobs", dict(SPEC, name=f"race-{kind}-{i}",
                                                                    data={"kind": "text", "path": "race.txt"}),
                                           timeout=20)
                except (socket.timeout, TimeoutError):
                    answers["no answer in 20 s"] = 1
                    break
                answers[st] = answers.get(st, 0) + 1
                if st == 201:
                    ds = api.call("GET", f"/v1/jobs/{made['id']}")[1]["spec"]["data"]["dataset"]
                    ids.add(ds)
                    content = api.call("GET", f"/v1/datasets/{ds}/content")[1]
                    if b"SECRET" in (content if isinstance(content, bytes) else json.dumps(content).encode()):
                        leaked.append(made["id"])
                    api.call("DELETE", f"/v1/jobs/{made['id']}")
        finally:
            stop_flag.set()
            t.join()
        check(f"race ({kind}): 40 submissions each answered 201 or 422 ({answers})",
              sum(answers.get(k, 0) for k in (201, 422)) == 40, answers)
        check(f"race ({kind}): no job imported the file outside the root", not leaked, leaked)
        try:
            st, plan, _ = api.call("POST", "/v1/plans", dict(SPEC, data={"kind": "text", "path": "corpus.txt"}),
                                   timeout=20)
        except (socket.timeout, TimeoutError):
            st, plan = "no answer in 20 s", None
        check(f"race ({kind}): the API still plans (no pool thread held)", st == 200, (st, plan))
        for ds in ids:
            api.call("DELETE", f"/v1/datasets/{ds}")
    os.unlink(outside.name)
    for f in ("race.txt", ".race.reg", ".race.odd"):
        if os.path.lexists(os.path.join(root, f)):
            os.unlink(os.path.join(root, f))


def welcome(ports):
    msg = driver.control_exchange(ports["control"], {"type": "register", "version": 7, "name": "fake", "token": CLUSTER,
                                                     "data_addr": "127.0.0.1:1", "cores": 1, "threads": 1,
                                                     "software": "test"})
    want = f"http://127.0.0.1:{ports['http']}"
    check("welcome.http_url is the API's URL", msg.get("type") == "welcome" and msg.get("http_url") == want, msg)


def vm(pid, key):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0


def big_upload(api, pid, tmp):
    n = 1 << 30
    if os.environ.get("PW_TEST_SKIP_1GIB") == "1":
        print(f"SKIP test_datasets 1 GiB upload: PW_TEST_SKIP_1GIB=1 (free under {tmp}: "
              f"{shutil.disk_usage(tmp).free >> 20} MiB)")
        return
    rss0 = vm(pid, "VmRSS")
    conn = http.client.HTTPConnection("127.0.0.1", api.port, timeout=600)
    conn.putrequest("POST", "/v1/datasets?name=big")
    conn.putheader("Authorization", "Bearer " + TOKEN)
    conn.putheader("Content-Type", "application/octet-stream")
    conn.putheader("Content-Length", str(n))
    conn.endheaders()
    h = hashlib.sha256()
    block = bytearray(os.urandom(1 << 20))
    peak = rss0
    t0 = time.time()
    for i in range(n >> 20):
        block[:8] = struct.pack("<Q", i)  # every MiB differs
        conn.send(block)
        h.update(block)
        if i % 64 == 0:
            peak = max(peak, vm(pid, "VmRSS"))
    r = conn.getresponse()
    ds = json.loads(r.read())
    conn.close()
    secs = time.time() - t0
    hwm = vm(pid, "VmHWM")
    grow = max(peak, hwm) - rss0
    print(f"note 1 GiB upload: {secs:.1f} s; coordinator VmRSS before {rss0 >> 20} MiB, peak sampled "
          f"{peak >> 20} MiB, VmHWM after {hwm >> 20} MiB: grew {grow / (1 << 20):.1f} MiB")
    check("1 GiB upload -> 201 with its sha256", r.status == 201 and ds.get("id") == h.hexdigest()
          and ds.get("size") == n, (r.status, ds))
    check("the coordinator's RSS grew less than 64 MiB", grow < 64 << 20, f"{grow >> 20} MiB")
    if r.status == 201:
        api.call("DELETE", "/v1/datasets/" + ds["id"])


def main():
    if not os.access(os.path.join(BUILD, "pipewright-coordinator"), os.X_OK):
        print("SKIP test_datasets: no pipewright-coordinator built")
        sys.exit(77)
    tmp = tempfile.mkdtemp(prefix="pw-ds-")
    root = os.path.join(tmp, "root")
    os.makedirs(root)
    procs, logs = [], []
    try:
        p, ports, log = start(tmp, "c1", ["--data-root", root])
        procs.append(p)
        logs.append(log)
        api = Api(ports["http"])
        ds, tok = crud(api, os.path.join(tmp, "c1"))
        in_use(api, ds)
        refusals(api, root, tok)
        races(api, root)
        welcome(ports)
        big_upload(api, p.pid, tmp)
        check("no upload file is left behind at the end", not uploads_left(os.path.join(tmp, "c1")))

        p2, ports2, log2 = start(tmp, "c2", [])
        procs.append(p2)
        logs.append(log2)
        api2 = Api(ports2["http"])
        st, err, _ = api2.call("POST", "/v1/jobs", dict(SPEC, data={"kind": "text", "path": "corpus.txt"}))
        check("without --data-root every path is refused, saying so", st == 422 and err["error"]["path"] ==
              "data.path" and "no --data-root" in err["error"]["message"] and jobs_total(api2) == 0, (st, err))
    finally:
        for p in procs:
            stop(p)
    for log in logs:
        text = open(log, errors="replace").read()
        for bad in ("AddressSanitizer", "LeakSanitizer", "runtime error:"):
            if bad in text:
                check(f"{os.path.basename(log)}: no sanitizer report", False, text[-3000:])
    if failures:
        print("---- coordinator log (tail) ----\n" + open(logs[0], errors="replace").read()[-3000:])
        print(f"FAIL test_datasets: {len(failures)} checks failed")
        sys.exit(1)
    shutil.rmtree(tmp, ignore_errors=True)
    print("PASS test_datasets")


if __name__ == "__main__":
    main()

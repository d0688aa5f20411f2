#!/usr/bin/env python3
"""test_contention: a real coordinator and four one-thread workers on this
machine (they report the same host: /etc/machine-id).

  - /v1/workers shows each worker's host and hostname (this machine's);
    a worker registering without them (an older one) gets null, and
    `pipewright workers` prints a HOST column;
  - a pp=4 job on the four workers, with fewer than 4 cores here: the job
    JSON's contention names the host, its cores, ranks [0, 1, 2, 3],
    4 threads and share 4 / cores, the message says so, one "contention"
    event says it at dispatch, and the timeline carries the plan's bubble
    under that sharing beside the measured and planned ones: at least
    1 - cores/4 (the ranks compute at most cores/4 of the time) and above
    the plain plan's, and `pipewright timeline` prints it with the message;
  - a pp=2 job on two one-thread workers (2 threads, at least 2 cores): no
    contention object, no event, and no shared bubble.
Usage: test_contention.py BUILD_DIR SOURCE_DIR (exit 77: skipped)"""
import json, os, socket, struct, subprocess, sys, tempfile, urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import driver as d  # noqa: E402

BUILD, SRC = sys.argv[1], sys.argv[2]
FAILS = []


def check(what, cond, detail=""):
    print(("ok   " if cond else "FAIL ") + what + (f": {detail}" if detail and not cond else ""), flush=True)
    if not cond:
        FAILS.append(what)
    return cond


def spec(pp):
    return {"name": f"share-pp{pp}",
            "model": {"template": "gpt", "vocab_size": 256, "seq_len": 32, "d_model": 64, "n_layers": 4, "n_heads": 2},
            "mesh": {"pp": pp}, "schedule": {"name": "1f1b", "microbatches": 4},
            "train": {"steps": 3, "batch_size": 8, "seed": 5,
                      "optimizer": {"name": "adamw", "lr": 3e-3}},
            "data": {"kind": "text", "path": os.path.join(SRC, "examples/data/corpus.txt"), "sampler": "sequential"}}


def old_worker(c):
    """Registers like a worker from before host/hostname, then hangs up."""
    s = socket.create_connection(("127.0.0.1", c.ctl), timeout=10)
    reg = json.dumps({"type": "register", "version": 7, "name": "old", "token": "", "data_addr": "127.0.0.1:1",
                      "cores": 1, "threads": 1, "software": "test"}).encode()
    s.sendall(struct.pack(">I", len(reg)) + reg)
    row = d.wait_for(lambda: next((w for w in c.worker_rows() if w["name"] == "old"), None), 10)
    s.close()
    d.wait_for(lambda: all(w["state"] == "lost" for w in c.worker_rows() if w["name"] == "old"), 10)
    return row


def contract_check(c, paths):
    """Every answer validates against api/openapi.yaml (when jsonschema and
    yaml are installed: test_openapi's Contract)."""
    try:
        from test_openapi import Contract
    except (ImportError, SystemExit):
        print("(no jsonschema/yaml: answers not checked against api/openapi.yaml)")
        return
    k = Contract(SRC)
    for p in paths:
        with urllib.request.urlopen(c.base + p, timeout=30) as r:
            body, headers = r.read(), {h.lower(): v for h, v in r.headers.items()}
            try:
                k.check("GET", p, r.status, headers, body)
                check(f"{p} validates against api/openapi.yaml", True)
            except AssertionError as e:
                check(f"{p} validates against api/openapi.yaml", False, str(e)[:600])


def main():
    cores = os.cpu_count() or 1
    if cores >= 4:
        print(f"SKIP test_contention: {cores} cores here; 4 one-thread ranks do not share them")
        return 77
    tmp = tempfile.mkdtemp(prefix="pw-contention-")
    c = d.Cluster(BUILD, tmp, "cont", data_root=SRC)
    try:
        row = old_worker(c)
        check("an older worker (no host in register) is accepted; its host and hostname are null",
              row is not None and row.get("host") is None and row.get("hostname") is None, row)
        for i in range(4):
            c.start_worker(f"w{i}")
        check("4 workers idle", c.wait_idle(4))
        ws = [w for w in c.worker_rows() if w["name"] != "old"]
        hosts = {w.get("host") for w in ws}
        check("the workers report this machine's hostname and one host id",
              all(w.get("hostname") == socket.gethostname() for w in ws) and len(hosts) == 1 and None not in hosts, ws)
        out = subprocess.run([os.path.join(BUILD, "pipewright"), "workers", "--coordinator", c.base],
                             capture_output=True, text=True, timeout=30).stdout
        lines = out.splitlines()
        check("pipewright workers: a HOST column with the hostname",
              lines and lines[0].split()[:3] == ["NAME", "ADDRESS", "HOST"] and
              all(socket.gethostname() in ln for ln in lines[1:] if ln.startswith("w")), out)

        jid = c.submit(spec(4))
        job = c.wait_job(jid)
        check("pp=4 job succeeds", job.get("state") == "succeeded", job.get("error"))
        ct = job.get("contention") or {}
        h = (ct.get("hosts") or [{}])[0]
        check("job JSON: contention on one host, ranks 0-3, 4 threads, share 4/cores",
              len(ct.get("hosts", [])) == 1 and h.get("ranks") == [0, 1, 2, 3] and h.get("threads") == 4 and
              h.get("cores") == cores and abs(h.get("share", 0) - 4 / cores) < 1e-9 and
              h.get("hostname") == socket.gethostname() and h.get("other_threads") == 0, ct)
        want = f"4 ranks with 1 thread each share {cores} core{'s' if cores > 1 else ''} on host {socket.gethostname()}"
        check("the message names ranks, threads, cores and host", ct.get("message", "").startswith(want), ct)
        if cores == 2:
            check("2 cores: each rank gets about half a core", ct.get("message", "").endswith("half a core"), ct)
        evs = [e for e in c.events(jid) if e.get("kind") == "contention"]
        check("one contention event at dispatch, with the message",
              len(evs) == 1 and evs[0].get("message") == ct.get("message"), evs)
        st, tl = d.http(c.base, f"/v1/jobs/{jid}/timeline")
        b = tl.get("bubble", {}) if isinstance(tl, dict) else {}
        ps, pl = b.get("planned_shared"), b.get("planned")
        check("timeline: measured, planned and planned_shared bubbles",
              st == 200 and isinstance(b.get("measured"), float) and isinstance(pl, float) and
              isinstance(ps, float) and 0 <= ps < 1, b)
        # 4 one-thread ranks on `cores` cores compute at most cores/4 of the time
        check("the shared-cores bubble is at least 1 - cores/4, above the plain plan's",
              isinstance(ps, float) and ps >= 1 - cores / 4 - 1e-9 and ps > pl, b)
        check("timeline: the contention object as in the job", tl.get("contention") == ct, tl.get("contention"))
        out = subprocess.run([os.path.join(BUILD, "pipewright"), "timeline", str(jid), "--coordinator", c.base],
                             capture_output=True, text=True, timeout=30).stdout
        check("pipewright timeline: the shared-cores bubble and the message",
              isinstance(ps, float) and f"        planned on shared cores {100 * ps:.1f}%: {ct.get('message')}\n" in out, out)
        contract_check(c, ["/v1/workers", f"/v1/jobs/{jid}", f"/v1/jobs/{jid}/timeline"])
        print(f"figures: measured {b.get('measured')}, planned {pl}, planned_shared {ps}", flush=True)

        jid2 = c.submit(spec(2))
        job2 = c.wait_job(jid2)
        check("pp=2 job succeeds", job2.get("state") == "succeeded", job2.get("error"))
        check("pp=2 on 2 one-thread workers: no contention object", job2.get("contention") is None,
              job2.get("contention"))
        check("no contention event", not [e for e in c.events(jid2) if e.get("kind") == "contention"])
        st, tl2 = d.http(c.base, f"/v1/jobs/{jid2}/timeline")
        check("timeline: planned_shared null, contention null",
              st == 200 and tl2["bubble"].get("planned_shared", 0) is None and tl2.get("contention", 0) is None, tl2)
    finally:
        d.close_cluster(c, tmp, lambda *a: check(*a[:2]), lambda: bool(FAILS))
    print(f"{'FAIL' if FAILS else 'PASS'} test_contention ({len(FAILS)} failed)")
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())

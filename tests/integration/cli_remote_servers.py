#!/usr/bin/env python3
"""cli_remote_servers: small loopback servers for test_cli_remote.sh.

  tls     a TLS terminator: https on 127.0.0.1 in front of a plain-HTTP
          upstream on 127.0.0.1 (the certificate is made by the test)
  proxy   a forward proxy (absolute-form HTTP and CONNECT) that logs each
          request line and reaches only 127.0.0.1: host names given with
          --map NAME are sent there, anything else gets 403
  odd     a server that answers badly on purpose, by path: a huge
          Content-Length, an endless chunked body, silence, a non-JSON 502,
          a JSON API error, not HTTP at all; job 5, which lost workers
          (three attempts) and can be retried; and job 6, running for its
          first three polls, whose events appear a few at a time (for
          `logs --follow`: each once, since= moving on); under the path
          prefix /fleet, /v1/workers is a canned fleet (kernels, warnings);
          the timelines of jobs 7 (a 200 cut short) and 8 (a 200 that is
          not JSON)
  datasets  the coordinator's dataset routes and POST/DELETE /v1/jobs as
          api/openapi.yaml and docs/contracts.md describe them, for the CLI
          before (and besides) the real coordinator: uploads are read in
          chunks, hashed, stored in --store as temp + rename, and logged
          (length, sha256, whether they asked for 100-continue); a job's
          data.path is refused (422 at data.path) unless --data-root holds
          it; each job received is logged as JSON

Each binds 127.0.0.1:0, writes its port to --ready, and exits by itself
after --lifetime seconds (the test also kills it). Nothing here ever
connects beyond 127.0.0.1.
"""
import argparse
import hashlib
import json
import os
import select
import socket
import ssl
import sys
import threading
import time
import urllib.parse

LOOPBACK = "127.0.0.1"


def log_line(path, text):
    if path:
        with open(path, "a") as f:
            f.write(text + "\n")


def pump(a, b):
    """Copies bytes both ways until either side closes."""
    socks = [a, b]
    try:
        while True:
            ready = [s for s in socks if isinstance(s, ssl.SSLSocket) and s.pending()]
            if not ready:
                ready, _, _ = select.select(socks, [], [], 60)
                if not ready:
                    return
            for s in ready:
                data = s.recv(65536)
                if not data:
                    return
                (b if s is a else a).sendall(data)
    except OSError:
        return


def read_head(conn):
    """The request head (up to the blank line) and whatever body bytes came with it."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = conn.recv(65536)
        if not chunk:
            return None, b""
        buf += chunk
        if len(buf) > 1 << 20:
            return None, b""
    head, rest = buf.split(b"\r\n\r\n", 1)
    return head.decode("latin-1"), rest


def serve(handler, args):
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((LOOPBACK, 0))
    srv.listen(64)
    tmp = args.ready + ".tmp"
    with open(tmp, "w") as f:
        f.write("%d\n" % srv.getsockname()[1])
    os.rename(tmp, args.ready)
    deadline = time.monotonic() + args.lifetime
    while time.monotonic() < deadline:
        r, _, _ = select.select([srv], [], [], 1)
        if r:
            conn, _ = srv.accept()
            threading.Thread(target=guarded, args=(handler, conn, args), daemon=True).start()


def guarded(handler, conn, args):
    try:
        handler(conn, args)
    except (OSError, ssl.SSLError, ValueError):
        pass
    finally:
        conn.close()


# ---- tls ---------------------------------------------------------------------

def tls_handler(conn, args):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(args.cert, args.key)
    conn.settimeout(30)
    try:
        tls = ctx.wrap_socket(conn, server_side=True)
    except (ssl.SSLError, OSError) as e:
        log_line(args.log, "handshake failed: %s" % e)
        return
    log_line(args.log, "tls connection")
    tls.settimeout(None)
    up = socket.create_connection((LOOPBACK, args.upstream), timeout=30)
    up.settimeout(None)
    try:
        pump(tls, up)
    finally:
        up.close()
        tls.close()


# ---- proxy -------------------------------------------------------------------

def split_hostport(s, default):
    if s.startswith("["):
        host, _, rest = s[1:].partition("]")
        return host, int(rest[1:]) if rest.startswith(":") else default
    host, _, port = s.partition(":")
    return host, int(port) if port else default


def proxy_handler(conn, args):
    head, rest = read_head(conn)
    if head is None:
        return
    lines = head.split("\r\n")
    method, target, version = lines[0].split(" ", 2)
    log_line(args.log, "%s %s" % (method, target))
    allowed = set(args.map) | {LOOPBACK, "localhost"}
    if method == "CONNECT":
        host, port = split_hostport(target, 443)
        if host not in allowed:
            conn.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
            return
        up = socket.create_connection((LOOPBACK, port), timeout=30)
        conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        if rest:
            up.sendall(rest)
    else:
        if not target.startswith("http://"):
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
            return
        hostport, slash, path = target[len("http://"):].partition("/")
        host, port = split_hostport(hostport, 80)
        if host not in allowed:
            conn.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
            return
        headers = [h for h in lines[1:] if h.split(":", 1)[0].strip().lower() not in ("connection", "proxy-connection")]
        out = "%s /%s %s\r\n%s\r\nConnection: close\r\n\r\n" % (method, path, version, "\r\n".join(headers))
        up = socket.create_connection((LOOPBACK, port), timeout=30)
        up.sendall(out.encode("latin-1") + rest)
    up.settimeout(None)
    conn.settimeout(None)
    try:
        pump(conn, up)
    finally:
        up.close()


# ---- odd ---------------------------------------------------------------------

T0 = 1795500000.0
# GET /v1/jobs/5 on the odd server: two attempts interrupted by a lost
# worker (the second resumed from a snapshot), the third failed.
LOST_JOB = {
    "id": 5, "name": "lost", "state": "failed", "status": "", "model": "gpt d=32 L=2 H=4", "schedule": "1f1b",
    "mesh": {"pp": 4, "dp": 1, "virtual_stages": 1}, "microbatches": 4, "progress": {"step": 14, "total": 20},
    "loss": 2.5, "tokens_per_s": 1000.0, "created": T0, "started": T0 + 1, "finished": T0 + 60, "run": 6,
    "error": "restarts exhausted (2 of 2)", "restarts": 2, "max_restarts": 2, "ranks": [], "eta_seconds": None,
    "attempts": [
        {"attempt": 1, "run": 3, "state": "interrupted", "started": T0 + 1, "finished": T0 + 20,
         "reason": "worker w2 (127.0.0.1:4411, rank 2) lost at step 13: no heartbeat for 10 s",
         "start_step": 0, "resumed_from": "start", "workers": ["w0", "w1", "w2", "w3"]},
        {"attempt": 2, "run": 5, "state": "interrupted", "started": T0 + 21, "finished": T0 + 40,
         "reason": "worker w4 (127.0.0.1:4415, rank 2) lost at step 14: link closed",
         "start_step": 12, "resumed_from": "snapshot", "workers": ["w0", "w1", "w4", "w3"]},
        {"attempt": 3, "run": 6, "state": "failed", "started": T0 + 41, "finished": T0 + 60,
         "reason": "rank 1: out of memory", "start_step": None, "resumed_from": None, "workers": []},
    ]}


# Job 6: GET /v1/jobs/6 says running three times, then succeeded; each
# poll of the job makes two more of its events visible.
JOB6 = {"polls": 0}
EVENTS6 = [
    {"id": 1, "time": T0, "kind": "state", "message": "queued: waiting for 2 idle workers"},
    {"id": 2, "time": T0 + 1, "kind": "state", "message": "queued -> planning: 2 idle workers"},
    {"id": 3, "time": T0 + 2, "kind": "state", "message": "planning -> running: ranks 0 -> w1, 1 -> w2"},
    {"id": 4, "time": None, "kind": None, "message": "checkpoint at step 5"},
    {"id": 5, "time": T0 + 9, "kind": "note", "message": "worker w2 slow: 3 heartbeats late"},
    {"id": 6, "time": T0 + 12, "kind": "state", "message": "running -> succeeded: 10 steps"},
]


def job6(conn, target):
    if target.endswith("/v1/jobs/6"):
        JOB6["polls"] += 1
        state = "running" if JOB6["polls"] <= 3 else "succeeded"
        send_json(conn, 200, {"id": 6, "name": "follow-me", "state": state}, close=True)
        return
    since = int(urllib.parse.parse_qs(urllib.parse.urlsplit(target).query).get("since", ["0"])[0])
    visible = EVENTS6[:min(len(EVENTS6), 2 * JOB6["polls"])] if JOB6["polls"] <= 3 else EVENTS6
    send_json(conn, 200, {"events": [e for e in visible if e["id"] > since]}, close=True)


FORCED_WARNING = ("OpenBLAS kernel Haswell forced by OPENBLAS_CORETYPE; this CPU supports AVX-512 kernels "
                  "(about 2x sgemm): unset it")


def fleet_worker(name, port, **kw):
    w = {"id": port - 4410, "name": name, "addr": "127.0.0.1:%d" % port, "state": "idle", "heartbeat_age": 0.4,
         "job": None, "rank": None, "cores": 2, "threads": 1, "memory": 1 << 33, "software": "pipewright-worker 0.1.0",
         "blas_core": None, "blas_forced": None, "cpu_level": None, "gemm_gflops": None, "warnings": [],
         "host": None, "hostname": None}
    w.update(kw)
    return w


FLEET = {"workers": [
    fleet_worker("w0", 4411, blas_core="Haswell", blas_forced=True, cpu_level="avx512", gemm_gflops=121.7,
                 warnings=[FORCED_WARNING], host="m-1", hostname="node-a"),
    fleet_worker("w1", 4412, state="busy", job=3, rank=3, coordinate={"pipeline_rank": 1, "replica": 0, "tp_rank": 1},
                 blas_core="Cooperlake", blas_forced=False, cpu_level="avx512", gemm_gflops=215.2, host="m-1", hostname="node-a"),
    fleet_worker("old", 4413),  # a worker from before the kernel report
]}


def odd_handler(conn, args):
    head, rest = read_head(conn)
    if head is None:
        return
    method, target, _ = head.split("\r\n")[0].split(" ", 2)
    log_line(args.log, "%s %s" % (method, target))
    if target.endswith("/v1/jobs/1"):  # claims 100 GiB
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 107374182400\r\n\r\n{")
        conn.settimeout(30)
        conn.recv(1)  # until the client gives up
    elif target.endswith("/v1/jobs/2"):  # chunked, without end (stopped at 256 MiB)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
        chunk = b"%x\r\n%s\r\n" % (1 << 20, b" " * (1 << 20))
        for _ in range(256):
            conn.sendall(chunk)
    elif target.endswith("/v1/jobs/3"):  # never answers
        conn.settimeout(args.lifetime)
        conn.recv(1)
    elif target.endswith("/v1/jobs/4"):
        body = b"upstream gone\n"
        conn.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s"
                     % (len(body), body))
    elif target.endswith("/v1/jobs/5"):  # a job that lost workers, then failed
        send_json(conn, 200, LOST_JOB, close=True)
    elif "/v1/jobs/6" in target:
        job6(conn, target)
    elif "/v1/jobs/7/timeline" in target:  # a 200 cut short: `timeline -o` must save nothing
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n"
                     b"Connection: close\r\n\r\n{\"traceEvents\": [")
    elif "/v1/jobs/8/timeline" in target:  # a 200 that is not JSON (a proxy's page, say)
        body = b"<html>maintenance</html>\n"
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: %d\r\n"
                     b"Connection: close\r\n\r\n%s" % (len(body), body))
    elif method == "POST" and target.endswith("/v1/jobs/5/retry"):
        send_json(conn, 200, {"id": 5, "state": "queued", "location": "/v1/jobs/5"}, close=True)
    elif method == "POST" and target.endswith("/v1/jobs"):
        body = (b'{"error": {"code": "invalid_spec", "message": "must be at most 4096 (odd server)",'
                b' "path": "model.seq_len"}}')
        conn.sendall(b"HTTP/1.1 422 Unprocessable Entity\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    elif target.endswith("/fleet/v1/workers"):  # a canned fleet: a forced kernel, a free one, an old worker
        send_json(conn, 200, FLEET, close=True)
    else:  # /v1/workers: not HTTP at all
        conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n")

# ---- datasets ----------------------------------------------------------------

HEX = set("0123456789abcdef")
DS_LOCK = threading.Lock()
JOBS = {}  # id -> {"state", "dataset"}


def is_id(s):
    return len(s) == 64 and set(s) <= HEX


def read_request(conn, buf):
    """One request head from conn (buf: bytes already read): (method, target, headers, rest) or None."""
    while b"\r\n\r\n" not in buf:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        buf += chunk
        if len(buf) > 1 << 20:
            return None
    head, rest = buf.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    method, target, _ = lines[0].split(" ", 2)
    headers = {}
    for h in lines[1:]:
        k, _, v = h.partition(":")
        headers[k.strip().lower()] = v.strip()
    return method, target, headers, rest


def send_json(conn, status, obj, close=False):
    reasons = {200: "OK", 201: "Created", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found",
               409: "Conflict", 411: "Length Required", 413: "Payload Too Large", 422: "Unprocessable Entity"}
    body = json.dumps(obj).encode()
    conn.sendall(b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s"
                 % (status, reasons[status].encode(), len(body), b"Connection: close\r\n" if close else b"", body))


def api_error(conn, status, code, path, message, close=False):
    send_json(conn, status, {"error": {"code": code, "message": message, "path": path}}, close)


def describe(store, ds_id):
    """The dataset object of a stored file, as the contract gives it."""
    path = os.path.join(store, ds_id)
    meta = json.load(open(path + ".json"))
    size = os.path.getsize(path)
    d = {"id": ds_id, "sha256": ds_id, "size": size, "format": "text", "name": meta["name"],
         "created": meta["created"]}
    with open(path, "rb") as f:
        head = f.read(32)
    if head[:8] == b"PWTOKENS" and len(head) == 32:
        d.update(format="tokens", width=int.from_bytes(head[12:16], "little"),
                 vocab_size=int.from_bytes(head[16:20], "little"), n_tokens=int.from_bytes(head[24:32], "little"))
    return d


def store_file(args, src_read, length, name):
    """Streams length bytes from src_read into the store: (id, new)."""
    tmp = os.path.join(args.store, ".upload-%d" % threading.get_ident())
    h = hashlib.sha256()
    got = reads = 0
    with open(tmp, "wb") as f:
        while got < length:
            chunk = src_read(min(1 << 16, length - got))
            if not chunk:
                raise ValueError("body ended after %d of %d bytes" % (got, length))
            h.update(chunk)
            f.write(chunk)
            got += len(chunk)
            reads += 1
        f.flush()
        os.fsync(f.fileno())
    ds_id = h.hexdigest()
    with DS_LOCK:
        dst = os.path.join(args.store, ds_id)
        new = not os.path.exists(dst)
        if new:
            with open(dst + ".json.tmp", "w") as m:
                json.dump({"name": name, "created": time.time()}, m)
            os.rename(dst + ".json.tmp", dst + ".json")
            os.rename(tmp, dst)
        else:
            os.unlink(tmp)
    return ds_id, new, reads


def datasets_handler(conn, args):
    conn.settimeout(60)
    buf = b""
    token = open(args.token).read().strip() if args.token else None
    while True:
        req = read_request(conn, buf)
        if req is None:
            return
        method, target, headers, buf = req
        path, _, query = target.partition("?")
        params = dict(p.split("=", 1) for p in query.split("&") if "=" in p)
        length = int(headers.get("content-length", "0"))

        def take(n):
            nonlocal buf
            while not buf:
                buf = conn.recv(65536)
                if not buf:
                    return b""
            out, buf = buf[:n], buf[n:]
            return out

        if token and headers.get("authorization") != "Bearer " + token:
            # before any body: a client that asked for 100-continue sends none
            log_line(args.log, "%s %s refused: unauthorized (expect=%s)" % (method, path,
                                                                            headers.get("expect", "")))
            api_error(conn, 401, "unauthorized", "", "missing or wrong bearer token", close=True)
            return
        if method == "POST" and path == "/v1/datasets":
            if "chunked" in headers.get("transfer-encoding", "") or "content-length" not in headers:
                api_error(conn, 411, "invalid_argument", "", "Content-Length required", close=True)
                return
            if args.max_upload is not None and length > args.max_upload:
                # before any body, as for a wrong token
                log_line(args.log, "%s %s refused: too large (expect=%s)" % (method, path, headers.get("expect", "")))
                api_error(conn, 413, "too_large", "", "%d bytes: over this server's bound of %d" % (
                    length, args.max_upload), close=True)
                return
            if headers.get("expect", "").lower() == "100-continue":
                conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
            name = urllib.parse.unquote(params.get("name", ""))
            ds_id, new, reads = store_file(args, take, length, name)
            log_line(args.log, "upload name=%s length=%d sha256=%s new=%d type=%s expect=%s" % (
                name, length, ds_id, new, headers.get("content-type", ""), headers.get("expect", "")))
            send_json(conn, 201 if new else 200, describe(args.store, ds_id))
            continue
        body = b""
        while len(body) < length:
            chunk = take(length - len(body))
            if not chunk:
                return
            body += chunk
        log_line(args.log, "%s %s" % (method, target))
        parts = path.strip("/").split("/")
        if parts[:2] == ["v1", "datasets"]:
            datasets_route(conn, args, method, parts[2:])
        elif parts[:2] == ["v1", "jobs"]:
            jobs_route(conn, args, method, parts[2:], body)
        else:
            api_error(conn, 404, "not_found", "", "no route for %s" % path)


def datasets_route(conn, args, method, rest):
    if not rest and method == "GET":
        ids = sorted(f for f in os.listdir(args.store) if is_id(f))
        send_json(conn, 200, {"datasets": [describe(args.store, i) for i in ids]})
        return
    if not rest or not is_id(rest[0]) or len(rest) > 2 or (len(rest) == 2 and rest[1] != "content"):
        api_error(conn, 404, "not_found", "", "no such route")
        return
    ds_id = rest[0]
    path = os.path.join(args.store, ds_id)
    if not os.path.exists(path):
        api_error(conn, 404, "not_found", "ds", "no dataset %s" % ds_id)
    elif method == "GET" and len(rest) == 1:
        send_json(conn, 200, describe(args.store, ds_id))
    elif method == "DELETE" and len(rest) == 1:
        users = [j for j, v in JOBS.items() if v["dataset"] == ds_id and v["state"] in ("queued", "running")]
        if users:
            api_error(conn, 409, "conflict", "ds", "dataset %s is used by job %d (queued)" % (ds_id, users[0]))
            return
        d = describe(args.store, ds_id)
        os.unlink(path)
        os.unlink(path + ".json")
        send_json(conn, 200, d)
    else:
        api_error(conn, 404, "not_found", "", "no such route")


def jobs_route(conn, args, method, rest, body):
    if method == "DELETE" and len(rest) == 1 and rest[0].isdigit() and int(rest[0]) in JOBS:
        JOBS[int(rest[0])]["state"] = "cancelled"
        send_json(conn, 200, {"id": int(rest[0]), "state": "cancelled"})
        return
    if method != "POST" or rest:
        api_error(conn, 404, "not_found", "", "no such route")
        return
    try:
        job = json.loads(body)
    except ValueError as e:
        api_error(conn, 400, "malformed_json", "", str(e))
        return
    log_line(args.log, "job " + json.dumps(job, sort_keys=True))
    data = job.get("data", {})
    if "path" in data and "dataset" in data:
        api_error(conn, 422, "invalid_spec", "data", "give data.path or data.dataset, not both")
        return
    if "path" in data:
        p = data["path"]
        if not args.data_root:
            api_error(conn, 422, "invalid_spec", "data.path",
                      "%s: local paths are refused: the coordinator has no --data-root" % p)
            return
        root = os.path.realpath(args.data_root)
        real = os.path.realpath(os.path.join(root, p))
        if os.path.commonpath([root, real]) != root or not os.path.isfile(real):
            api_error(conn, 422, "invalid_spec", "data.path", "%s: not a file under the data root %s" % (p, root))
            return
        with open(real, "rb") as f:  # imported as a dataset
            ds_id, _, _ = store_file(args, f.read, os.path.getsize(real), os.path.basename(real))
    else:
        ds_id = data.get("dataset", "")
        if not is_id(ds_id) or not os.path.exists(os.path.join(args.store, ds_id)):
            api_error(conn, 422, "invalid_spec", "data.dataset", "no dataset %s is stored" % ds_id)
            return
    jid = len(JOBS) + 1
    JOBS[jid] = {"state": "queued", "dataset": ds_id}
    send_json(conn, 201, {"id": jid, "state": "queued", "location": "/v1/jobs/%d" % jid})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["tls", "proxy", "odd", "datasets"])
    ap.add_argument("--ready", required=True)
    ap.add_argument("--log")
    ap.add_argument("--lifetime", type=float, default=600)
    ap.add_argument("--cert")
    ap.add_argument("--key")
    ap.add_argument("--upstream", type=int)
    ap.add_argument("--map", action="append", default=[], help="a host name the proxy sends to 127.0.0.1")
    ap.add_argument("--store", help="datasets: where uploads are stored")
    ap.add_argument("--data-root", help="datasets: the root a job's data.path must lie under (default: none)")
    ap.add_argument("--max-upload", type=int, help="datasets: refuse larger uploads with a 413")
    ap.add_argument("--token", help="datasets: a file holding the bearer token every /v1 route needs")
    args = ap.parse_args()
    handler = {"tls": tls_handler, "proxy": proxy_handler, "odd": odd_handler,
               "datasets": datasets_handler}[args.mode]
    serve(handler, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""cli_remote_servers: small loopback servers for test_cli_remote.sh.

  tls     a TLS terminator: https on 127.0.0.1 in front of a plain-HTTP
          upstream on 127.0.0.1 (the certificate is made by the test)
  proxy   a forward proxy (absolute-form HTTP and CONNECT) that logs each
          request line and reaches only 127.0.0.1: host names given with
          --map NAME are sent there, anything else gets 403
  odd     a server that answers badly on purpose, by path: a huge
          Content-Length, an endless chunked body, silence, a non-JSON 502,
          a JSON API error, not HTTP at all

Each binds 127.0.0.1:0, writes its port to --ready, and exits by itself
after --lifetime seconds (the test also kills it). Nothing here ever
connects beyond 127.0.0.1.
"""
import argparse
import os
import select
import socket
import ssl
import sys
import threading
import time

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
    elif method == "POST" and target.endswith("/v1/jobs"):
        body = (b'{"error": {"code": "invalid_spec", "message": "must be at most 4096 (odd server)",'
                b' "path": "model.seq_len"}}')
        conn.sendall(b"HTTP/1.1 422 Unprocessable Entity\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    else:  # /v1/workers: not HTTP at all
        conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["tls", "proxy", "odd"])
    ap.add_argument("--ready", required=True)
    ap.add_argument("--log")
    ap.add_argument("--lifetime", type=float, default=600)
    ap.add_argument("--cert")
    ap.add_argument("--key")
    ap.add_argument("--upstream", type=int)
    ap.add_argument("--map", action="append", default=[], help="a host name the proxy sends to 127.0.0.1")
    args = ap.parse_args()
    handler = {"tls": tls_handler, "proxy": proxy_handler, "odd": odd_handler}[args.mode]
    serve(handler, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""notify_check: plays systemd's side of the sd_notify protocol for one
daemon, as Type=notify + NotifyAccess=main would.

    notify_check.py [--expect-status TEXT] -- CMD ARGS...

Binds an abstract datagram socket with SO_PASSCRED, runs CMD with
NOTIFY_SOCKET=@name, and checks: READY=1 arrives (within 20 s, before the
daemon exits), sent by the main process itself (the kernel-attached sender
pid equals CMD's pid: NotifyAccess=main would drop anything else); the
address in READY's STATUS ("... on HOST:PORT ...") already accepts TCP
connections when READY arrives (readiness means serving); with
--expect-status, a STATUS= containing TEXT follows; on SIGTERM, STOPPING=1
arrives and the daemon exits 0. Prints what it received; exit 1 on any
failure."""
import os, re, select, signal, socket, struct, subprocess, sys, time

SCM_CREDENTIALS = 2


def main():
    args = sys.argv[1:]
    expect = None
    if args[:1] == ["--expect-status"]:
        expect, args = args[1], args[2:]
    if args[:1] == ["--"]:
        args = args[1:]
    name = "pw-notify-check-%d" % os.getpid()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    s.bind("\0" + name)
    env = dict(os.environ, NOTIFY_SOCKET="@" + name)
    p = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=open(os.devnull, "w"))
    got, problems = [], []

    def recv(deadline, want):
        """Datagrams until one satisfies want(fields) or the deadline."""
        while time.time() < deadline:
            r, _, _ = select.select([s], [], [], 0.1)
            if not r:
                if p.poll() is not None and not want.__name__ == "stopped":
                    return None
                continue
            data, anc, _, _ = s.recvmsg(4096, socket.CMSG_SPACE(12))
            pid = None
            for lvl, typ, cdata in anc:
                if lvl == socket.SOL_SOCKET and typ == SCM_CREDENTIALS:
                    pid = struct.unpack("iII", cdata[:12])[0]
            text = data.decode()
            print("  received from pid %s: %r" % (pid, text))
            if pid != p.pid:
                problems.append("datagram from pid %s, not the main pid %d" % (pid, p.pid))
            fields = dict(line.split("=", 1) for line in text.split("\n") if "=" in line)
            got.append(fields)
            if want(fields):
                return fields
        return None

    def ready(f): return f.get("READY") == "1"
    def status(f): return expect in f.get("STATUS", "")
    def stopped(f): return f.get("STOPPING") == "1"

    try:
        f = recv(time.time() + 20, ready)
        if f is None:
            problems.append("no READY=1 (daemon %s)" % ("exited %s" % p.poll() if p.poll() is not None else "silent"))
        else:
            m = re.search(r"on (\S+):(\d+)", f.get("STATUS", ""))
            if not m:
                problems.append("READY=1 without a STATUS naming the address it serves on")
            else:
                try:
                    socket.create_connection((m.group(1), int(m.group(2))), timeout=2).close()
                except OSError as e:
                    problems.append("READY=1 but %s:%s does not accept connections: %s" % (m.group(1), m.group(2), e))
            if expect and recv(time.time() + 20, status) is None:
                problems.append("no STATUS= containing %r" % expect)
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            if recv(time.time() + 20, stopped) is None:
                problems.append("no STOPPING=1 after SIGTERM")
        try:
            rc = p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            rc = p.wait()
            problems.append("did not exit within 20 s of SIGTERM")
        if rc != 0:
            problems.append("exit status %s after SIGTERM" % rc)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    for m in problems:
        print("  PROBLEM:", m)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""test_worker_fds: a worker's data port gives back every descriptor.

One real pipewright-worker on loopback, this script playing its coordinator
(register, welcome, heartbeats). Against its data port: connections that send
junk, connections that stay silent, HELLOs for a job the worker is not
running that stay open, and HELLOs for such a job that hang up at once. The
worker must close every one of them on its own (a pre-HELLO timeout, a
bounded wait for the job's run, a peer's hang-up noticed on a held link), so
its open descriptor count (/proc/PID/fd) comes back to its baseline while
this script still holds its ends open, and the heartbeat reports that count
(field fds). Waits are bounded polls; nothing is asserted about speed.

Then a job whose data path is a FIFO (tests/integration/driver.py, two
workers): the run fails with an error naming the path, no worker hangs
(both exit cleanly on shutdown), and once it has failed each worker's
heartbeat reports as many descriptors as before it was assigned."""
import json, os, random, shutil, signal, socket, struct, subprocess, sys, tempfile, threading, time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from driver import Conn, send_msg  # noqa: E402

BUILD, SRC = sys.argv[1], sys.argv[2]
FAILS = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        FAILS.append(what)


def _crc32c_table():
    t = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        t.append(c)
    return t


CRC_T = _crc32c_table()


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = CRC_T[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


assert crc32c(b"123456789") == 0xE3069283  # the standard check value


def frame(kind, job, body):
    """A u8 frame (HELLO, BYE) as common/proto/wire.h lays it out."""
    n = len(body)
    head = struct.pack("<4sHHIIIIIIBBH4II", b"PWF1", 2, kind, job, 0, 0, 0, 0, 0, 2, 1, 0, n, 0, 0, 0, n)
    head += struct.pack("<I", crc32c(body))
    head += struct.pack("<I", crc32c(head))
    assert len(head) == 64
    return head + body


def hello_frame(job, rank, token=""):
    return frame(1, job, json.dumps({"job": job, "run": 1, "rank": rank, "token": token}, separators=(",", ":")).encode())


def fd_count(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def wait_for(pred, timeout, step=0.1):
    end = time.time() + timeout
    while time.time() < end:
        v = pred()
        if v:
            return v
        time.sleep(step)
    return pred()


def stable_fds(pid, timeout=60):
    """The count once it has not moved for a second."""
    end = time.time() + timeout
    last, since = fd_count(pid), time.time()
    while time.time() < end:
        time.sleep(0.1)
        now = fd_count(pid)
        if now != last:
            last, since = now, time.time()
        elif time.time() - since >= 1.0:
            return now
    return last


class MiniCoordinator:
    """Registers one worker and keeps its heartbeats."""

    def __init__(self):
        self.lsock = socket.socket()
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(4)
        self.port = self.lsock.getsockname()[1]
        self.heartbeats, self.registered, self.conn = [], threading.Event(), None
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self):
        s, _ = self.lsock.accept()
        self.conn = c = Conn(s)
        while True:
            try:
                data = s.recv(1 << 16)
            except OSError:
                return
            if not data:
                return
            c.buf += data
            for m in c.messages():
                if m.get("type") == "register":
                    send_msg(s, {"type": "welcome", "version": 7, "worker_id": 1, "heartbeat_interval": 0.2})
                    self.registered.set()
                elif m.get("type") == "heartbeat":
                    self.heartbeats.append(m)


def leak_test(tmp):
    coord = MiniCoordinator()
    log_path = os.path.join(tmp, "worker.log")
    log = open(log_path, "w")
    w = subprocess.Popen([os.path.join(BUILD, "pipewright-worker"), "--coordinator", f"127.0.0.1:{coord.port}",
                          "--listen", "127.0.0.1:0", "--name", "fds", "--state-dir", os.path.join(tmp, "state"),
                          "--hello-timeout", "1", "--held-timeout", "2", "--log-level", "debug"],
                         stdout=log, stderr=subprocess.STDOUT)
    try:
        check(coord.registered.wait(60), "worker registered")
        data_port = wait_for(lambda: next((int(l.split("data plane on 127.0.0.1:")[1].split(",")[0])
                                           for l in open(log_path) if "data plane on 127.0.0.1:" in l), None), 30)
        check(bool(data_port), f"worker's data port ({data_port})")
        base = stable_fds(w.pid)
        print(f"baseline: {base} descriptors", flush=True)
        hb = wait_for(lambda: any(h.get("fds") == base for h in coord.heartbeats), 30)
        check(hb, f"a heartbeat reports fds = {base} (got {[h.get('fds') for h in coord.heartbeats[-3:]]})")

        rnd = random.Random(3)
        held = []        # our ends, kept open: the worker must close them
        n_silent, n_hello, n_hangup, n_bye = 120, 60, 60, 5

        def connect():
            return socket.create_connection(("127.0.0.1", data_port), timeout=10)

        for i in range(100):                 # junk: random bytes, a truncated header
            s = connect()
            s.sendall(bytes(rnd.getrandbits(8) for _ in range(rnd.randint(1, 200))) if i % 2 else b"PWF1\x02")
            held.append(s)
        for _ in range(n_silent):            # silent
            held.append(connect())
        for i in range(n_hello):             # HELLO for a job that is not running here
            s = connect()
            s.sendall(hello_frame(999, 1 + i % 3))
            held.append(s)
        for i in range(n_hangup):            # the same, then the peer hangs up
            s = connect()
            s.sendall(hello_frame(998, 1))
            s.close()
        for _ in range(n_bye):               # the same with a BYE saying why: kept for its run
            s = connect()
            s.sendall(hello_frame(997, 1) + frame(6, 997, b"peer gave up"))
            s.close()
        peak = fd_count(w.pid)
        print(f"after {len(held) + n_hangup + n_bye} connections: {peak} descriptors", flush=True)

        back = wait_for(lambda: fd_count(w.pid) <= base, 90, 0.2)
        check(back, f"descriptors back to the baseline {base} while our ends stay open (now {fd_count(w.pid)})")
        # every end we kept was closed by the worker
        closed, end = 0, time.time() + 30
        for s in held:
            s.settimeout(max(0.01, end - time.time()))
            try:
                while s.recv(4096):
                    pass
                closed += 1
            except ConnectionResetError:
                closed += 1
            except OSError:
                pass
        check(closed == len(held), f"the worker closed all {len(held)} links we kept open ({closed})")
        for s in held:
            s.close()
        text = open(log_path).read()
        check(text.count("no HELLO within") >= n_silent,
              f"silent links closed for no HELLO ({text.count('no HELLO within')} >= {n_silent})")
        check(text.count("held until that run starts") >= n_hello + n_hangup,
              f"HELLOs for an unknown job were held first ({text.count('held until that run starts')})")
        check(text.count("no run of job 999 started here") == n_hello,
              f"held links closed once their wait ran out ({text.count('no run of job 999 started here')})")
        check(text.count("peer hung up while its link waited for job 998") == n_hangup,
              f"held links closed on the peer's hang-up "
              f"({text.count('peer hung up while its link waited for job 998')})")
        check(text.count("no run of job 997 started here") == n_bye and "waited for job 997" not in text,
              "held links with a BYE left unread wait out their time (their run could read why)")
        check(wait_for(lambda: fd_count(w.pid) == base, 30), "and they stay at the baseline")
        n_hb = len(coord.heartbeats)
        check(wait_for(lambda: any(h.get("fds") == base for h in coord.heartbeats[n_hb:]), 30),
              "the heartbeat reports the baseline again")
        check(w.poll() is None, "the worker is still running")
    finally:
        w.send_signal(signal.SIGTERM)
        try:
            rc = w.wait(30)
        except subprocess.TimeoutExpired:
            w.kill()
            rc = "hung"
        check(rc == 0, f"worker exits cleanly ({rc})")


def fifo_test(tmp):
    fifo = os.path.join(tmp, "corpus.fifo")
    os.mkfifo(fifo)
    job = json.load(open(os.path.join(SRC, "examples", "jobs", "gpt-tiny.json")))
    job["train"]["steps"] = 2
    job["data"]["path"] = fifo
    spec = os.path.join(tmp, "fifo-job.json")
    json.dump(job, open(spec, "w"))
    out = os.path.join(tmp, "fifo-run")
    p = subprocess.run([sys.executable, os.path.join(HERE, "driver.py"), "--job", spec, "--build", BUILD,
                        "--src", SRC, "--out", out, "--timeout", "120", "--settle-fds", "60",
                        "--worker-arg=--held-timeout=2"], capture_output=True, text=True)
    print(p.stdout, p.stderr, flush=True)
    check(p.returncode == 1, f"the FIFO job fails (driver exit {p.returncode})")
    res = json.load(open(os.path.join(out, "result.json")))
    check(not res["timed_out"], "the FIFO job ends without timing out")
    msgs = [e.get("message", "") for e in res["errors"]]
    check(any(fifo in m and "not a regular file" in m for m in msgs),
          f"an error names the FIFO as not a regular file: {msgs}")
    check(res["exit_codes"] == [0, 0], f"both workers exit cleanly after it ({res['exit_codes']})")
    # the failed run's links (each worker had one out, one in) are all closed again
    check(res.get("fds_before") and res.get("fds_after") == res["fds_before"],
          f"each worker's descriptors after the failed job are those before it "
          f"({res.get('fds_before')} -> {res.get('fds_after')})")


def main():
    tmp = tempfile.mkdtemp(prefix="pw-fds-")
    try:
        leak_test(tmp)
        fifo_test(tmp)
    finally:
        if not FAILS:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print("kept", tmp)
    print("test_worker_fds:", "FAILED: " + "; ".join(FAILS) if FAILS else "ok")
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())

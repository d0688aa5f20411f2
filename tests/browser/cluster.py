"""cluster: a real coordinator and real workers on loopback for the browser
scripts (ephemeral ports, a temporary state dir, --ready-file), the API
over HTTP, and the waits they need. Every process is killed when Python
exits.

The waits follow what they wait for, not a clock: `job_until` polls a job
and fails as soon as it ends in a state that cannot become the one wanted,
or when nothing about it (state, status, step) has changed for `stall`
seconds; `until` is for conditions with no job behind them (a ready file,
workers registering), each with a budget the slowest build meets many
times over."""
import asyncio
import atexit
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

ENDED = ("succeeded", "failed", "cancelled")


class WaitError(AssertionError):
    pass


async def until(what, fn, seconds):
    """Calls fn (sync or async) every 0.1 s until it returns something true."""
    t0, last = time.monotonic(), None
    while time.monotonic() - t0 < seconds:
        try:
            v = fn()
            if asyncio.iscoroutine(v):
                v = await v
            if v:
                return v
        except WaitError:
            raise
        except Exception as e:  # noqa: BLE001 — a failed poll is retried; the last one is said
            last = e
        await asyncio.sleep(0.1)
    raise WaitError(f"timed out after {seconds:.0f} s waiting for {what}" + (f": {last}" if last else ""))


class Cluster:
    """Cluster(build, source, out): daemons log to out/NAME.log."""

    def __init__(self, build, source, out, slow=1):
        self.build, self.source, self.out, self.slow = build, source, out, slow
        self.procs = {}
        self.tmp = tempfile.mkdtemp(prefix="pw-browser-")
        self.base = self.token = None
        atexit.register(self.kill_all)

    # ---- processes ---------------------------------------------------------
    def start(self, name, binary, args):
        with open(os.path.join(self.out, f"{name}.log"), "wb") as log:
            p = subprocess.Popen([os.path.join(self.build, binary), *args], cwd=self.source,
                                 stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                 env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
        self.procs[name] = p
        return p

    def log_tail(self, name, n=30):
        try:
            with open(os.path.join(self.out, f"{name}.log"), encoding="utf-8", errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return "(no log)"

    async def stop(self, name, seconds=10):
        """SIGTERM, then SIGKILL after `seconds`; returns (exit code, how)."""
        p = self.procs[name]
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            t0 = time.monotonic()
            while p.poll() is None and time.monotonic() - t0 < seconds:
                await asyncio.sleep(0.05)
            if p.poll() is None:
                p.kill()
                p.wait()
                return (None, "SIGKILL (did not stop on SIGTERM)")
        return (p.returncode, "exit" if p.returncode >= 0 else f"signal {-p.returncode}")

    async def stop_all(self):
        for name in reversed(list(self.procs)):
            await self.stop(name)

    def kill_all(self):
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()

    def remove_scratch(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    # ---- daemons -----------------------------------------------------------
    async def coordinator(self, token=None):
        """Starts the coordinator (with --token-file when token is given)."""
        ready = os.path.join(self.tmp, "ready.json")
        args = ["--http", "127.0.0.1:0", "--control", "127.0.0.1:0",
                "--state-dir", os.path.join(self.tmp, "coordinator"), "--web", os.path.join(self.source, "web"),
                "--ready-file", ready, "--data-root", self.source]
        if token:
            tf = os.path.join(self.tmp, "api.token")
            fd = os.open(tf, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(token + "\n")
            args += ["--token-file", tf]
        self.token = token
        coord = self.start("coordinator", "pipewright-coordinator", args)

        def ports():
            if coord.poll() is not None:
                raise WaitError(f"coordinator exited {coord.returncode}:\n{self.log_tail('coordinator')}")
            if os.path.exists(ready):
                with open(ready, encoding="utf-8") as f:
                    return json.load(f)
            return None
        self.ports = await until("the coordinator's ready file", ports, 20 * self.slow)
        self.base = f"http://127.0.0.1:{self.ports['http']}"
        return coord

    def worker(self, name):
        return self.start(name, "pipewright-worker", [
            "--coordinator", f"127.0.0.1:{self.ports['control']}", "--listen", "127.0.0.1:0",
            "--name", name, "--state-dir", os.path.join(self.tmp, name)])

    async def workers(self, names):
        """Starts the named workers and waits until that many are idle."""
        for n in names:
            if n not in self.procs:
                self.worker(n)
        await self.idle(len(names))

    async def idle(self, n):
        async def enough():
            for name, p in self.procs.items():
                if name != "coordinator" and p.poll() is not None:
                    raise WaitError(f"worker {name} exited {p.returncode}:\n{self.log_tail(name)}")
            ws = (await self.api("/v1/workers"))["json"]["workers"]
            return sum(w["state"] == "idle" for w in ws) >= n
        await until(f"{n} idle workers", enough, 20 * self.slow)

    # ---- the API -----------------------------------------------------------
    def request(self, path, method="GET", body=None, auth=True, raw=False):
        """One HTTP request: {'status', 'json'} (or 'text' with raw)."""
        data = None if body is None else (body if isinstance(body, (bytes, str)) else json.dumps(body))
        if isinstance(data, str):
            data = data.encode()
        req = urllib.request.Request(self.base + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if auth and self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                status, text = r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            status, text = e.code, e.read().decode()
        if raw:
            return {"status": status, "text": text}
        return {"status": status, "json": json.loads(text) if text else None}

    async def api(self, path, method="GET", body=None, **kw):
        return await asyncio.to_thread(self.request, path, method, body, **kw)

    async def submit(self, spec):
        r = await self.api("/v1/jobs", "POST", spec)
        if r["status"] != 201:
            raise AssertionError(f"submit {spec.get('name')}: {r['status']} {r['json']}")
        return r["json"]["id"]

    async def job(self, jid):
        return (await self.api(f"/v1/jobs/{jid}"))["json"]

    async def cancel(self, jid):
        r = await self.api(f"/v1/jobs/{jid}", "DELETE")
        if r["status"] != 200:
            raise AssertionError(f"cancel job {jid}: {r['status']} {r['json']}")

    async def job_until(self, jid, what, pred, stall=None):
        """Polls job jid until pred(job) is true; returns the job. Fails at
        once when the job ends and pred is still false, and when its state,
        status and step have not moved for `stall` seconds (default 120,
        times the build's slowness) — never on a fixed total."""
        stall = stall or 120 * self.slow
        seen, since = None, time.monotonic()
        while True:
            j = await self.job(jid)
            if pred(j):
                return j
            if j["state"] in ENDED:
                raise WaitError(f"job {jid} ended {j['state']} ({j.get('error') or 'no error'}) "
                                f"before {what}")
            now = (j["state"], j.get("status"), (j.get("progress") or {}).get("step"))
            if now != seen:
                seen, since = now, time.monotonic()
            elif time.monotonic() - since > stall:
                raise WaitError(f"job {jid}: nothing moved for {stall:.0f} s (state {now[0]}, status {now[1]}, "
                                f"step {now[2]}) waiting for {what}")
            await asyncio.sleep(0.2)

    async def ended(self, jid):
        """Waits for the job to end; returns its final state."""
        j = await self.job_until(jid, "its end", lambda j: j["state"] in ENDED)
        return j["state"]

    async def job_in(self, jid, state):
        """Waits until the job is in `state`, failing if it ends otherwise."""
        return await self.job_until(jid, f"state {state}", lambda j: j["state"] == state)


BROWSER_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]


async def launch(playwright, profile, chromium):
    """Debian's chromium, headless, with a profile of its own."""
    return await playwright.chromium.launch_persistent_context(
        profile, executable_path=chromium, headless=True, viewport={"width": 1400, "height": 900},
        args=BROWSER_ARGS)

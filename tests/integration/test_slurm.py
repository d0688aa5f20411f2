#!/usr/bin/env python3
"""test_slurm: deploy/slurm/pipewright.sbatch under a real Slurm (issue 35)
— Debian's slurmctld and two slurmd (nodes n1, n2 on loopback, their own
ports, proctrack/linuxproc, no cgroup) with a private munged, all made
here in a temporary folder and stopped at the end.

  1. `sbatch --wait` of the script for a pp 2 job: the batch job exits 0,
     the model it writes (PW_OUT) equals `pipewright train`'s bit for bit,
     one worker ran on each node.
  2. The same job again, preempted: SIGTERM to the batch shell mid-run
     (`scancel --signal=TERM --batch`, what --signal=B:TERM@N sends): the
     script drains the coordinator (every rank stops at a step with its
     checkpoint) and requeues the job; Slurm runs it again (made eligible
     at once with `scontrol update StartTime=now`: Slurm itself waits
     about two minutes before it runs a requeued job), the script submits
     with the same key, gets the first job back, and the job resumes
     exactly where the drain stopped it (no step lost, none repeated);
     the batch job ends COMPLETED with exit 0 and its model equals
     `pipewright train`'s bit for bit.

Needs root (slurmd runs jobs as their users, munged's key). Usage:
test_slurm.py BUILD_DIR SOURCE_DIR"""
import json, os, re, shutil, socket, sqlite3, subprocess, sys, tempfile, time

BUILD, SRC = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import driver as d  # noqa: E402

SANITIZE = os.environ.get("PW_SANITIZE", "OFF") == "ON"
STEPS = 400 if SANITIZE else 1000  # the drain stops half a second of steps ahead: the job must outlast that
SCRIPT = os.path.join(SRC, "deploy/slurm/pipewright.sbatch")
check = d.Checks()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spec(name):
    return d.tiny_gpt(name, STEPS, 11, SRC)


class Slurm:
    """munged, slurmctld and slurmd n1, n2 in folder t."""

    def __init__(self, t):
        self.t = t
        os.makedirs(os.path.join(t, "log"))
        for n in ("state", "spool-n1", "spool-n2"):
            os.makedirs(os.path.join(t, n))
        key = os.path.join(t, "munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o400)
        self.sock = os.path.join(t, "munge.sock")
        subprocess.run(["/usr/sbin/munged", "-f", f"--socket={self.sock}", f"--key-file={key}",
                        f"--log-file={t}/log/munged.log", f"--pid-file={t}/munged.pid",
                        f"--seed-file={t}/munged.seed"], check=True)
        ctl, p1, p2 = free_port(), free_port(), free_port()
        self.conf = os.path.join(t, "slurm.conf")
        with open(self.conf, "w") as f:
            f.write(f"""ClusterName=pwtest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctl}
AuthType=auth/munge
AuthInfo=socket={self.sock}
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={t}/state
SlurmdSpoolDir={t}/spool-%n
SlurmctldPidFile={t}/slurmctld.pid
SlurmdPidFile={t}/slurmd-%n.pid
SlurmctldLogFile={t}/log/slurmctld.log
SlurmdLogFile={t}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
JobRequeue=1
MinJobAge=300
NodeName=n1 NodeAddr=127.0.0.1 NodeHostname=localhost Port={p1} CPUs=2 RealMemory=2000
NodeName=n2 NodeAddr=127.0.0.1 NodeHostname=localhost Port={p2} CPUs=2 RealMemory=2000
PartitionName=p Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP
""")
        self.env = {**os.environ, "SLURM_CONF": self.conf}
        subprocess.run(["/usr/sbin/slurmctld", "-i"], env=self.env, check=True)
        for n in ("n1", "n2"):
            subprocess.run(["/usr/sbin/slurmd", "-N", n], env=self.env, check=True)
        ok = d.wait_for(lambda: self.run("sinfo", "-h", "-o", "%D %T").stdout.split() == ["2", "idle"], 30, 0.2)
        if not ok:
            raise RuntimeError("slurm did not come up: " + self.run("sinfo").stdout + self.log("slurmctld"))

    def run(self, *cmd, **kw):
        return subprocess.run(list(cmd), env={**self.env, **kw.pop("env", {})}, capture_output=True, text=True,
                              timeout=kw.pop("timeout", 60), **kw)

    def job(self, jid):
        """{field: value} of scontrol show job."""
        out = self.run("scontrol", "show", "job", str(jid)).stdout
        return dict(re.findall(r"(\w+)=(\S*)", out))

    def log(self, name):
        p = os.path.join(self.t, "log", name + ".log")
        return open(p, errors="replace").read()[-3000:] if os.path.exists(p) else ""

    def stop(self):
        """SIGTERM to every daemon at once, then up to 10 s for them to go
        (SIGKILL then)."""
        pids = []
        for pid_file in ("slurmd-n1.pid", "slurmd-n2.pid", "slurmctld.pid", "munged.pid"):
            try:
                pid = int(open(os.path.join(self.t, pid_file)).read().split()[0])
                os.kill(pid, 15)
                pids.append(pid)
            except (OSError, ValueError, IndexError):
                pass

        def gone(pid):  # exited (a zombie of ours counts: its parent, this test, never waits on it)
            try:
                return open(f"/proc/{pid}/stat").read().split(") ")[1][0] == "Z"
            except OSError:
                return True
        d.wait_for(lambda: all(gone(p) for p in pids), 10, 0.05)
        for p in pids:
            if not gone(p):
                os.kill(p, 9)


def db_runs(state):
    """[(run id, state, start_step, stop_step)] of pipewright job 1 in the coordinator's store."""
    con = sqlite3.connect(os.path.join(state, "coordinator", "pipewright.db"))
    try:
        return con.execute("SELECT id, state, start_step, stop_step FROM runs WHERE job_id = 1 ORDER BY id").fetchall()
    finally:
        con.close()


def main():
    if os.geteuid() != 0:
        print("SKIP test_slurm: needs root (slurmd and munged run as root here)")
        return 77
    for b in ("/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/munged", "/usr/bin/sbatch"):
        if not os.path.exists(b):
            print(f"SKIP test_slurm: {b} is missing (deploy/install-deps.sh installs slurmctld, slurmd, "
                  "slurm-client and munge)")
            return 77
    t = tempfile.mkdtemp(prefix="pw-slurm-")
    ref = d.train_reference(BUILD, spec("ref"), t, "slurm")
    jf = os.path.join(t, "job.json")
    json.dump(spec("slurm"), open(jf, "w"))
    sl = Slurm(t)
    env = {"PW_BIN_DIR": BUILD, "PW_COORD_HOST": "127.0.0.1", "PW_BIND": "127.0.0.1", "PW_LISTEN_HOST": "127.0.0.1",
           "PW_WATCH_INTERVAL": "0.5", "OPENBLAS_NUM_THREADS": "1"}
    try:
        # 1. uninterrupted
        out1, st1 = os.path.join(t, "run1.out"), os.path.join(t, "state1")
        p = sl.run("sbatch", "--wait", "--cpus-per-task=1", f"--output={out1}", "--chdir", t, SCRIPT, jf,
                   env={**env, "PW_STATE_DIR": st1, "PW_OUT": os.path.join(t, "model1.safetensors")}, timeout=300)
        text = open(out1, errors="replace").read() if os.path.exists(out1) else ""
        check("sbatch --wait of the script exits 0", p.returncode == 0, p.stdout + p.stderr + text[-2000:])
        check("the script says the job succeeded", re.search(r"job \d+: succeeded", text) is not None, text[-2000:])
        model1 = open(os.path.join(t, "model1.safetensors"), "rb").read() \
            if os.path.exists(os.path.join(t, "model1.safetensors")) else None
        diff = d.bit_diff(model1, ref)
        check("its model equals pipewright train's bit for bit", diff == "", diff)
        wl = open(os.path.join(st1, "workers.log"), errors="replace").read() if os.path.exists(
            os.path.join(st1, "workers.log")) else ""
        names = set(re.findall(r"slurm\d+-([01])", wl))
        check("srun started a worker on each of the two tasks", names == {"0", "1"}, wl[-1000:])

        # 2. preempted and requeued
        out2, st2 = os.path.join(t, "run2.out"), os.path.join(t, "state2")
        p = sl.run("sbatch", "--parsable", "--cpus-per-task=1", f"--output={out2}", "--chdir", t, SCRIPT, jf,
                   env={**env, "PW_STATE_DIR": st2, "PW_OUT": os.path.join(t, "model2.safetensors")})
        jid = p.stdout.strip().split(";")[0]
        check("sbatch queues the second batch job", jid.isdigit(), p.stdout + p.stderr)

        def api_step():
            try:
                port = json.load(open(os.path.join(st2, "ready.json")))["http"]
                tok = open(os.path.join(st2, "api.token")).read().strip()
            except (OSError, ValueError, KeyError):
                return 0
            import urllib.request
            req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/jobs/1",
                                         headers={"Authorization": f"Bearer {tok}"})
            try:
                with urllib.request.urlopen(req, timeout=5) as r:
                    return (json.loads(r.read()).get("progress") or {}).get("step") or 0
            except OSError:
                return 0
        check("the job trains", d.wait_for(lambda: api_step() >= 10, 120, 0.05))
        before = api_step()
        sl.run("scancel", "--signal=TERM", "--batch", jid)
        requeued = d.wait_for(lambda: sl.job(jid).get("Restarts") == "1" and
                              sl.job(jid).get("JobState") == "PENDING", 120, 0.2)
        check("after SIGTERM the script drains and requeues the job (PENDING, Restarts=1)", requeued, sl.job(jid))
        runs = db_runs(st2)
        check("the first run ended interrupted with the step it stopped at", len(runs) == 1 and
              runs[0][1] == "interrupted" and (runs[0][3] or 0) >= before, (runs, before))
        sl.run("scontrol", "update", f"JobId={jid}", "StartTime=now")
        done = d.wait_for(lambda: sl.job(jid).get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"),
                          180, 0.3)
        info = sl.job(jid)
        text = open(out2, errors="replace").read() if os.path.exists(out2) else ""
        check("the requeued batch job ends COMPLETED with exit 0", done and info.get("JobState") == "COMPLETED" and
              info.get("ExitCode") == "0:0", (info, text[-2500:]))
        check("its output says it drained, requeued and then found its job by the key",
              "SIGTERM: draining" in text and "requeueing job" in text and
              text.count("pipewright job 1 (key slurm-pwtest-") == 2, text[-2500:])
        runs = db_runs(st2)
        stop = runs[0][3] if runs else None
        check(f"the second run resumed at the step the drain stopped at ({stop}): nothing lost, nothing repeated",
              len(runs) == 2 and runs[1][2] == stop and runs[1][1] == "succeeded", runs)
        model2 = open(os.path.join(t, "model2.safetensors"), "rb").read() \
            if os.path.exists(os.path.join(t, "model2.safetensors")) else None
        diff = d.bit_diff(model2, ref)
        check("its model equals pipewright train's bit for bit", diff == "", diff)
        logs = "".join(open(os.path.join(s, f), errors="replace").read() for s in (st1, st2)
                       for f in ("coordinator.log", "workers.log") if os.path.exists(os.path.join(s, f)))
        bad = [ln for ln in logs.splitlines() if "AddressSanitizer" in ln or "runtime error:" in ln]
        check("no sanitizer report in the daemons' logs", not bad, bad[:5])
    finally:
        sl.run("scancel", "--full", "-u", "root")
        sl.stop()
    print(f"{check.passed} passed, {check.failed} failed")
    if check.failed:
        for f in ("slurmctld", "slurmd-n1", "slurmd-n2"):
            print(f"--- {f}.log (tail)\n{sl.log(f)[-1200:]}")
        for s in ("state1", "state2"):
            for f in ("coordinator.log", "workers.log"):
                p = os.path.join(t, s, f)
                if os.path.exists(p):
                    print(f"--- {s}/{f} (tail)\n" + "".join(open(p, errors="replace").readlines()[-15:]))
        print(f"kept {t}")
    else:
        shutil.rmtree(t, ignore_errors=True)
    return 1 if check.failed else 0


if __name__ == "__main__":
    sys.exit(main())

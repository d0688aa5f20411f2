"""cgroup.py: a cgroup with a CPU quota and a memory limit, made the way
this machine allows, for tests that start processes inside one
(test_cgroup_resources.py, test_k8s_netns.py).

  cg = Cgroup("pw-test-123", cpus=1, memory=2 << 30)
  cg.ok        False when none can be made here; cg.why says why
  cg.prefix    a command prefix to start a process in it (systemd-run), or []
  cg.procs     cgroup.procs files a child writes its pid into before it
               execs (cg.enter() does it), or []
  cg.how       what it is, for the log
  cg.remove()  removes what was made (after its processes have exited)

In order of preference: a systemd scope (systemd-run --scope -p
CPUQuota= -p MemoryMax=) where systemd is PID 1; a folder made under a
cgroup2 mount that has the cpu and memory controllers (cpu.max,
memory.max); folders made in the cgroup v1 cpu and memory hierarchies
(cpu.cfs_quota_us / cpu.cfs_period_us, memory.limit_in_bytes). Needs root."""
import os, shutil, subprocess, time

PERIOD = 100000


def _write(path, text):
    with open(path, "w") as f:
        f.write(text)


def mounts():
    """(fstype, mount point, super options) of every cgroup mount."""
    out = []
    for line in open("/proc/self/mountinfo"):
        pre, _, post = line.partition(" - ")
        f, p = pre.split(), post.split()
        if len(f) >= 5 and len(p) >= 3 and p[0] in ("cgroup", "cgroup2"):
            out.append((p[0], f[4].replace("\\040", " "), p[2].split(",")))
    return out


class Cgroup:
    def __init__(self, tag, cpus, memory):
        self.prefix, self.procs, self.dirs, self.how, self.ok = [], [], [], "", False
        quota, why = int(cpus * PERIOD), []
        comm = open("/proc/1/comm").read().strip() if os.path.exists("/proc/1/comm") else ""
        if comm == "systemd" and shutil.which("systemd-run"):
            props = ["-p", f"CPUQuota={int(cpus * 100)}%", "-p", f"MemoryMax={memory}"]
            probe = subprocess.run(["systemd-run", "--scope", "--quiet", *props, "true"], capture_output=True,
                                   text=True)
            if probe.returncode == 0:
                self.prefix = ["systemd-run", "--scope", "--quiet", *props, "--"]
                self.how = f"a systemd scope ({' '.join(props[1::2])})"
                self.ok = True
                return
            why.append("systemd-run --scope failed: " + probe.stderr.strip()[:200])
        else:
            why.append(f"PID 1 is {comm or '?'}, not systemd")
        ms = mounts()
        for top in [m for t, m, _ in ms if t == "cgroup2"]:
            ctl = os.path.join(top, "cgroup.controllers")
            have = open(ctl).read().split() if os.path.exists(ctl) else []
            if "cpu" not in have or "memory" not in have:
                why.append(f"the cgroup2 mount {top} has no cpu and memory controllers ({' '.join(have) or 'none'})")
                continue
            d = os.path.join(top, tag)
            try:
                sub = open(os.path.join(top, "cgroup.subtree_control")).read().split()
                for c in ("cpu", "memory"):
                    if c not in sub:
                        _write(os.path.join(top, "cgroup.subtree_control"), "+" + c)
                os.mkdir(d)
                self.dirs.append(d)
                _write(os.path.join(d, "cpu.max"), f"{quota} {PERIOD}")
                _write(os.path.join(d, "memory.max"), str(memory))
                self.procs = [os.path.join(d, "cgroup.procs")]
                self.how = f"cgroup v2 {d} (cpu.max {quota} {PERIOD}, memory.max {memory})"
                self.ok = True
                return
            except OSError as e:
                why.append(f"cannot make a cgroup v2 under {top}: {e}")
                self.remove()
        cpu = [m for t, m, o in ms if t == "cgroup" and "cpu" in o]
        mem = [m for t, m, o in ms if t == "cgroup" and "memory" in o]
        if cpu and mem:
            try:
                dc, dm = os.path.join(cpu[0], tag), os.path.join(mem[0], tag)
                for d in (dc, dm):
                    os.mkdir(d)
                    self.dirs.append(d)
                _write(os.path.join(dc, "cpu.cfs_period_us"), str(PERIOD))
                _write(os.path.join(dc, "cpu.cfs_quota_us"), str(quota))
                _write(os.path.join(dm, "memory.limit_in_bytes"), str(memory))
                self.procs = [os.path.join(dc, "cgroup.procs"), os.path.join(dm, "cgroup.procs")]
                self.how = f"cgroup v1 {dc} and {dm} (cfs quota {quota} of {PERIOD}, limit {memory})"
                self.ok = True
                return
            except OSError as e:
                why.append(f"cannot make cgroup v1 folders: {e}")
                self.remove()
        else:
            why.append("no cgroup v1 cpu and memory hierarchies")
        self.why = "no cgroup can be made here: " + "; ".join(why)

    def enter(self):
        """In the child, before exec: into the cgroup."""
        for p in self.procs:
            _write(p, str(os.getpid()))

    def remove(self):
        for d in reversed(self.dirs):
            for _ in range(50):
                try:
                    os.rmdir(d)
                    break
                except OSError:
                    time.sleep(0.1)  # its last process is still leaving
        self.dirs = []

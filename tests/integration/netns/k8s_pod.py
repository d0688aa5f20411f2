"""k8s_pod.py SPEC.json: one container of a pod, as a container runtime
starts it, for test_k8s_netns.py. Run it in the pod's network namespace and
in a mount and UTS namespace of its own:

  ip netns exec NS unshare --mount --uts --cgroup --propagation private -- python3 k8s_pod.py SPEC.json

It builds the container's root filesystem in SPEC["root"] (a tmpfs): this
machine's system folders (usr, etc, var, opt, and bin, lib, ... where they
are folders) as overlays, so the image's files can be put in without
touching the machine's; /proc, /sys (the network namespace's), the cgroup
filesystems (the pod's cgroup at their root) and /dev;
the image's files and the pod's volumes bind-mounted at their paths
(SPEC["binds"]: [source, path, read_only]); the files the runtime writes
(SPEC["files"]: /etc/hosts, /etc/resolv.conf). With
SPEC["read_only_root"] the root is remounted read-only, volumes aside
(readOnlyRootFilesystem). Then it sets the hostname (the pod's name),
chroots, sets no_new_privs, takes the
user and groups of the pod's securityContext and execs SPEC["argv"] with
exactly SPEC["env"], searching the image's PATH: the caller's pid is the
container's process. Any step that fails exits 125 naming it."""
import ctypes, json, os, socket, subprocess, sys

SYSTEM = ("usr", "etc", "var", "opt", "bin", "sbin", "lib", "lib32", "lib64", "libx32")


def host_cgroup_mounts():
    """(path, fstype, options) of the machine's mounts at and below
    /sys/fs/cgroup, as PID 1 sees them (ip netns exec gave this process a
    /sys without them)."""
    out = []
    for line in open("/proc/1/mountinfo"):
        pre, _, post = line.partition(" - ")
        f, p = pre.split(), post.split()
        mp = f[4].replace("\\040", " ")
        if (mp == "/sys/fs/cgroup" or mp.startswith("/sys/fs/cgroup/")) and p[0] in ("tmpfs", "cgroup", "cgroup2"):
            out.append((mp, p[0], [o for o in p[2].split(",") if o not in ("rw", "ro")]))
    return sorted(out, key=lambda m: len(m[0]))


def die(msg):
    print(f"k8s_pod: {msg}", file=sys.stderr, flush=True)
    sys.exit(125)


def mount(*args):
    p = subprocess.run(["mount", *args], capture_output=True, text=True)
    if p.returncode:
        die(f"mount {' '.join(args)}: {p.stderr.strip()}")


def main():
    spec = json.load(open(sys.argv[1]))
    root, scratch = spec["root"], spec["root"] + ".rw"
    for d in (root, scratch):
        os.makedirs(d, exist_ok=True)
        mount("-t", "tmpfs", "-o", "mode=755,size=256m", "pw-pod", d)
    overlays = []
    for name in sorted(os.listdir("/")):
        src, dst = "/" + name, os.path.join(root, name)
        if os.path.islink(src):
            os.symlink(os.readlink(src), dst)
        elif not os.path.isdir(src):
            continue
        elif name in SYSTEM:
            up, work = os.path.join(scratch, name, "u"), os.path.join(scratch, name, "w")
            os.makedirs(up)
            os.makedirs(work)
            os.mkdir(dst)
            mount("-t", "overlay", "overlay", "-o", f"lowerdir={src},upperdir={up},workdir={work}", dst)
            overlays.append(dst)
        elif name == "proc":
            os.mkdir(dst)
            mount("-t", "proc", "proc", dst)
        elif name in ("sys", "dev"):
            os.mkdir(dst)
            mount("--rbind", src, dst)
        else:
            os.mkdir(dst)  # tmp, run, home, ...: empty, as in an image
    os.chmod(os.path.join(root, "tmp"), 0o1777)
    # the cgroup filesystems, read-only, as runc mounts them: in the cgroup
    # namespace this process was started in, the pod's cgroup is their root
    for mp, fstype, opts in host_cgroup_mounts():
        t = root + mp
        os.makedirs(t, exist_ok=True)
        if fstype == "tmpfs":
            mount("-t", "tmpfs", "-o", "mode=755,size=1m", "cgroup-root", t)
        elif fstype == "cgroup2":
            mount("-t", "cgroup2", "-o", "ro", "cgroup2", t)
        else:
            mount("-t", "cgroup", "-o", ",".join(["ro"] + [o for o in opts if "=" not in o or o.startswith("name=")]),
                  "cgroup", t)
    for path, text in spec.get("files", {}).items():
        p = root + path
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "w") as f:
            f.write(text)
    for src, path, ro in spec.get("binds", []):
        p = root + path
        if os.path.isdir(src):
            os.makedirs(p, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(p), exist_ok=True)
            open(p, "a").close()
        mount("--bind", src, p)
        if ro:
            mount("-o", "remount,bind,ro", p)
    if spec.get("read_only_root"):
        for d in overlays:
            mount("-o", "remount,ro", d)
        mount("-o", "remount,bind,ro", root)
    try:
        socket.sethostname(spec["hostname"])
        os.chroot(root)
        os.chdir(spec.get("cwd") or "/")
        if ctypes.CDLL(None, use_errno=True).prctl(38, 1, 0, 0, 0):  # PR_SET_NO_NEW_PRIVS
            die("prctl(PR_SET_NO_NEW_PRIVS) failed")
        os.setgroups(spec.get("groups", []))
        os.setgid(spec.get("gid", 0))
        os.setuid(spec.get("uid", 0))
    except OSError as e:
        die(f"entering the container: {e}")
    env = dict(spec["env"])
    try:
        os.execvpe(spec["argv"][0], spec["argv"], env)  # PATH from env: the image's
    except OSError as e:
        die(f"exec {spec['argv'][0]} (PATH {env.get('PATH')}): {e}")


main()

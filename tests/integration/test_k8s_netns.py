#!/usr/bin/env python3
"""test_k8s_netns: deploy/k8s run as Kubernetes would run it, without
Kubernetes. Each pod — the coordinator StatefulSet's pod 0, every replica
of the worker StatefulSet, and the example Job's pod — is a network
namespace on a bridge (netns/lib.sh: pod i has 10.200.0.(10+i); the bridge's
10.200.0.1 plays the node, where the kubelet's probes come from) with a
container inside (netns/k8s_pod.py): a root filesystem of its own with the
image's files where the Debian packages put them (/usr/bin/pipewright*
from the build, /usr/share/pipewright/{web,api,examples} from the source),
its volumes at their mountPaths (the Secret's token files with their
defaultMode and the fsGroup's group, the ConfigMap's job.json, emptyDirs,
the claim of volumeClaimTemplates), read-only where readOnlyRootFilesystem
says so, its securityContext's user and groups, a cgroup with its
resources.limits (netns/cgroup.py), and the container's command and args
with $(VAR) expanded, and exactly its env: values, and the downward API's
fields as Kubernetes fills them (metadata.name, status.podIP, spec.nodeName,
...). Names resolve as the cluster's DNS would answer them: each pod's
/etc/hosts holds the Services (a ClusterIP Service at the address of the
pod its selector picks — there is one — when its port is its target port,
since nothing translates ports here; a headless one at its pods'), and the
StatefulSet pods' own names.

Checks, in order:
  1. the coordinator's readiness probe (httpGet, from the node) passes, then
     its liveness probe (tcpSocket);
  2. the workers register under their pod names with their pod IPs' data
     addresses, their nodes' names as host ids, and the cores and memory
     their cgroups give (memory = the limit; cores as the limit's CPUs allow
     here);
  3. the Job's command runs to exit status 0: it submits job.json (its
     data.path uploaded as a dataset: the coordinator reads no local paths),
     and `pipewright watch` follows the pp 2 job to success on the two
     workers; the checkpoint it made equals `pipewright train`'s bit for bit;
     a second pod of the Job (a lost one's replacement) submits with the
     same key, gets the same job back and follows it: no second job;
  4. every connection the run needs is allowed by the NetworkPolicies as
     written, and one it does not need (the Job's pod to a worker's data
     port) is not;
  5. SIGTERM, as the kubelet sends it, ends every daemon with status 0.
Where no cgroup can be made, the cores and memory checks are left out and
the test exits 77 after the rest, saying so.
Usage: test_k8s_netns.py BUILD_DIR SOURCE_DIR"""
import json, os, re, secrets, shutil, signal, subprocess, sys, tempfile, time

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "netns"))
from cgroup import Cgroup  # noqa: E402

BUILD, SRC = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
K8S = os.path.join(SRC, "deploy", "k8s")
NAME = "test_k8s_netns"
TAG = f"pwk{os.getpid()}"
LIB = os.path.join(HERE, "netns", "lib.sh")
PY = "/usr/bin/python3"
NODE_IP = "10.200.0.1"
IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # debian:12's
# Where the Debian packages put the image's files (install-files.cmake), and
# what of this checkout stands for each.
IMAGE = [(os.path.join(BUILD, b), "/usr/bin/" + b) for b in ("pipewright", "pipewright-coordinator", "pipewright-worker")]
IMAGE += [(os.path.join(SRC, d), "/usr/share/pipewright/" + d) for d in ("web", "api", "examples")]
# The test's sanitizer settings reach the daemons (a sanitized build's), nothing else of its environment.
PASS_ENV = ("ASAN_OPTIONS", "UBSAN_OPTIONS", "LSAN_OPTIONS", "PW_CPU")
FAILED = 0
SKIPPED = []


def check(label, ok, detail=""):
    global FAILED
    print(f"{'ok  ' if ok else 'FAIL'} {label}{(': ' + str(detail)) if detail and not ok else ''}", flush=True)
    FAILED += not ok
    return ok


def fail(msg):
    print(f"FAIL {NAME}: {msg}", flush=True)
    sys.exit(1)


def sh(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


# ---- the manifests, as kustomize would build them -----------------------------------------

def kustomize(d):
    """The objects of kustomization d: its resources, its generated
    Secrets (values from gen[name][file]), the namespace set on each."""
    kz = yaml.safe_load(open(os.path.join(d, "kustomization.yaml")))
    objs = []
    for r in kz.get("resources", []):
        objs += [o for o in yaml.safe_load_all(open(os.path.join(d, r))) if o]
    for g in kz.get("secretGenerator", []):
        if not (g.get("options") or {}).get("disableNameSuffixHash"):
            fail(f"secretGenerator {g['name']}: the test needs disableNameSuffixHash (names are not rewritten here)")
        objs.append({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": g["name"]},
                     "data": {os.path.basename(f): None for f in g.get("files", [])}})
    for o in objs:
        if o["kind"] != "Namespace" and kz.get("namespace"):
            o.setdefault("metadata", {})["namespace"] = kz["namespace"]
    return objs


OBJS = kustomize(K8S) + kustomize(os.path.join(K8S, "example-job"))
BY = {(o["kind"], o["metadata"]["name"]): o for o in OBJS}


def obj(kind, name):
    if (kind, name) not in BY:
        fail(f"no {kind} {name} in deploy/k8s")
    return BY[(kind, name)]


def labels_match(sel, labels):
    return all(labels.get(k) == v for k, v in (sel or {}).items())


class Pod:
    def __init__(self, name, template, node, ip, owner, ordinal=None):
        self.name, self.t, self.node, self.ip, self.owner = name, template, node, ip, owner
        self.ns = template["metadata"].get("namespace") or owner["metadata"].get("namespace") or "default"
        self.labels = dict(template["metadata"].get("labels", {}))
        self.spec = template["spec"]
        self.uid = f"0000-{name}"
        if ordinal is not None:  # StatefulSet pods: label and stable network identity
            self.labels["statefulset.kubernetes.io/pod-name"] = name
            self.subdomain = owner["spec"]["serviceName"]
        else:
            self.subdomain = None
        if owner["kind"] == "Job":
            self.labels.update({"batch.kubernetes.io/job-name": owner["metadata"]["name"],
                                "batch.kubernetes.io/controller-uid": f"0000-{owner['metadata']['name']}"})
        if len(self.spec["containers"]) != 1 or self.spec.get("initContainers"):
            fail(f"pod {name}: one container and no init containers, as the test runs them")
        self.c = self.spec["containers"][0]
        self.proc, self.cg, self.log = None, None, None

    def field(self, path):
        """A downward-API fieldRef, as the kubelet fills it."""
        m = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
        if m:
            return (self.labels if m.group(1) == "labels" else self.t["metadata"].get("annotations", {})).get(
                m.group(2), "")
        v = {"metadata.name": self.name, "metadata.namespace": self.ns, "metadata.uid": self.uid,
             "spec.nodeName": self.node, "spec.serviceAccountName": self.spec.get("serviceAccountName", "default"),
             "status.hostIP": NODE_IP, "status.podIP": self.ip, "status.podIPs": self.ip}.get(path)
        if v is None:
            fail(f"pod {self.name}: fieldRef {path} is not one the test fills")
        return v

    def port(self, p):
        """A named or numbered container port."""
        if isinstance(p, int):
            return p
        for cp in self.c.get("ports", []):
            if cp.get("name") == p:
                return cp["containerPort"]
        fail(f"pod {self.name}: no container port named {p}")


def expand(s, env):
    """Kubernetes' $(VAR) expansion: defined names replaced, $$ is $,
    anything else left as written."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), s)


# ---- the run --------------------------------------------------------------------------------

def main():
    for b in ("pipewright", "pipewright-coordinator", "pipewright-worker"):
        if not os.access(os.path.join(BUILD, b), os.X_OK):
            fail(f"no {BUILD}/{b}")
    T = tempfile.mkdtemp(prefix="pw-k8s.")
    os.chmod(T, 0o755)
    pods, made = [], []
    try:
        run(T, pods, made)
    finally:
        for p in pods:
            if p.proc and p.proc.poll() is None:
                p.proc.kill()
                p.proc.wait()
        sh(["bash", "-c", f". {LIB}; netns_down {TAG}"])
        for p in pods:
            if p.cg:
                p.cg.remove()
        if FAILED and os.environ.get("KEEP") != "1":
            for p in pods:
                if p.log and os.path.exists(p.log):
                    print(f"---- {p.name}\n" + open(p.log, errors="replace").read()[-2500:])
        if os.environ.get("KEEP") == "1":
            print(f"kept {T}")
        else:
            sh(["umount", "-R", "-l", T])  # the pods' mounts live in their namespaces; nothing should be left
            shutil.rmtree(T, ignore_errors=True)


def run(T, pods, made):
    coord_sts, worker_sts = obj("StatefulSet", "pipewright-coordinator"), obj("StatefulSet", "pipewright-worker")
    job = obj("Job", "pipewright-train-example")
    n_workers = worker_sts["spec"].get("replicas", 1)
    addr = lambda i: f"10.200.0.{10 + i}"  # noqa: E731 (netns/lib.sh's netns_addr)
    pods.append(Pod("pipewright-coordinator-0", coord_sts["spec"]["template"], "node-1", addr(0), coord_sts, 0))
    for i in range(n_workers):
        pods.append(Pod(f"pipewright-worker-{i}", worker_sts["spec"]["template"], f"node-{1 + i % 2}",
                        addr(1 + i), worker_sts, i))
    pods.append(Pod("pipewright-train-example-x7k2p", job["spec"]["template"], "node-2", addr(1 + n_workers), job))
    coord, workers, client = pods[0], pods[1:-1], pods[-1]

    # the network: one namespace per pod, and the node on the bridge
    r = sh(["bash", "-c", f". {LIB}; netns_up {TAG} {len(pods)} && ip -n {TAG}-br addr add {NODE_IP}/24 dev br0"])
    if r.returncode:
        fail(f"cannot build the namespaces: {r.stderr.strip()}")

    # the Secret's values: fresh tokens, as the operator makes the files
    secret = obj("Secret", "pipewright-tokens")
    secret["data"] = {k: secrets.token_hex(32) for k in secret["data"]}

    # cluster DNS: each Service's name at the pods it selects
    hosts = []
    for (kind, name), s in BY.items():
        if kind != "Service":
            continue
        chosen = [p for p in pods if labels_match(s["spec"].get("selector"), p.labels)]
        if not check(f"Service {name} selects a pod", len(chosen) >= 1, s["spec"].get("selector")):
            continue
        if s["spec"].get("clusterIP") != "None":
            for sp in s["spec"]["ports"]:
                tp = chosen[0].port(sp.get("targetPort", sp["port"]))
                check(f"Service {name}: port {sp['port']} is its target port {tp} (no port translation here)",
                      tp == sp["port"])
            check(f"ClusterIP Service {name} has one pod behind it", len(chosen) == 1, [p.name for p in chosen])
        ns = chosen[0].ns
        for p in chosen[:1] if s["spec"].get("clusterIP") != "None" else chosen:
            hosts.append(f"{p.ip}\t{name}.{ns}.svc.cluster.local {name}.{ns}.svc {name}.{ns} {name}")
        if s["spec"].get("clusterIP") == "None":
            for p in chosen:
                if p.subdomain == name:
                    hosts.append(f"{p.ip}\t{p.name}.{name}.{ns}.svc.cluster.local {p.name}.{name}")

    # the pods' cgroups, from resources.limits
    no_cgroup = None
    for p in pods:
        lim = (p.c.get("resources") or {}).get("limits") or {}
        if "cpu" in lim or "memory" in lim:
            p.cg = Cgroup(f"{TAG}-{p.name}", cpus=cpu_of(lim.get("cpu", "64")), memory=bytes_of(lim.get("memory", "1Ti")))
            if not p.cg.ok:
                no_cgroup, p.cg = p.cg.why, None

    base_env = {k: os.environ[k] for k in PASS_ENV if k in os.environ}
    for p in [coord]:
        start(T, p, secret, hosts, base_env)
    # 1. probes, from the node, as the kubelet runs them
    rp, lp = coord.c.get("readinessProbe"), coord.c.get("livenessProbe")
    if not check("the coordinator has a readiness and a liveness probe", rp and lp):
        return
    ready = wait(lambda: probe(coord, rp) or exited(coord), 20)
    if not check("the coordinator's readiness probe passes (" + describe(rp) + ")", ready is True,
                 exited(coord) or "no answer in 20 s"):
        return
    check("the coordinator's liveness probe passes (" + describe(lp) + ")", probe(coord, lp) is True)

    # 2. the workers
    for p in workers:
        start(T, p, secret, hosts, base_env)
    api_token = secret["data"]["api.token"]
    api = lambda path: api_get(coord, path, api_token)  # noqa: E731
    ws = wait(lambda: (lambda w: w if len([x for x in w if x["state"] == "idle"]) == len(workers) else None)(
        (api("/v1/workers") or {}).get("workers", [])), 30)
    if not check(f"{len(workers)} workers register", ws, [exited(p) for p in workers]):
        return
    byname = {w["name"]: w for w in ws}
    for p in workers:
        w = byname.get(p.name)
        if not check(f"{p.name} is registered under its pod name", w, list(byname)):
            continue
        check(f"{p.name}: data address on its pod IP", w["addr"] == f"{p.ip}:7100", w["addr"])
        check(f"{p.name}: host id is its node's name", w.get("host") == p.node, w.get("host"))
        if p.cg:
            lim = p.c["resources"]["limits"]
            want_mem, want_cpu = bytes_of(lim["memory"]), min(int(cpu_of(lim["cpu"]) + 0.999), len(os.sched_getaffinity(0)))
            check(f"{p.name}: memory {w.get('memory')} is its limit {lim['memory']} ({w.get('memory_from')})",
                  w.get("memory") == want_mem, w)
            check(f"{p.name}: {w['cores']} cores, its limit's {lim['cpu']} as this machine allows ({w.get('cores_from')})",
                  w["cores"] == want_cpu, w)
            threads = [a for a in p.c["args"] if a.startswith("--threads=")]
            check(f"{p.name}: --threads as many as its CPU limit", threads == [f"--threads={lim['cpu']}"], threads)

    # 3. the Job
    t0 = time.time()
    start(T, client, secret, hosts, base_env)
    try:
        client.proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        client.proc.kill()
        client.proc.wait()
    out = open(client.log, errors="replace").read()
    print("  " + "\n  ".join(out.strip().splitlines()[-4:]))
    check(f"the Job's command exits 0 ({time.time() - t0:.1f} s)", client.proc.returncode == 0,
          f"status {client.proc.returncode}")
    m = re.search(r"submitted as job (\d+)", out)
    if check("it submitted the job", m, out[-500:]):
        j = api(f"/v1/jobs/{m.group(1)}") or {}
        check("the job succeeded", j.get("state") == "succeeded", (j.get("state"), j.get("status")))
        check("its 2 ranks ran on the worker pods", sorted(r["worker"] for r in j.get("ranks", [])) ==
              sorted(p.name for p in workers)[:2], j.get("ranks"))
        spec = j.get("spec") or {}
        check("its data went as a dataset (the coordinator reads no local paths)",
              "dataset" in spec.get("data", {}), spec.get("data"))
        # the model it trained: `pipewright train`'s on the same spec, bit for
        # bit (with as many OpenBLAS threads: a product's sums follow them)
        js = json.loads(obj("ConfigMap", "pipewright-train-example")["data"]["job.json"])
        js["data"]["path"] = js["data"]["path"].replace("/usr/share/pipewright/", SRC + "/")
        with open(os.path.join(T, "ref.json"), "w") as f:
            json.dump(js, f)
        threads = [a.split("=", 1)[1] for a in workers[0].c["args"] if a.startswith("--threads=")] or ["1"]
        ref = sh([os.path.join(BUILD, "pipewright"), "train", "--job", os.path.join(T, "ref.json"), "--threads",
                  threads[0], "--out", os.path.join(T, "ref.safetensors")])  # the workers' OpenBLAS threads
        got = sh(["ip", "netns", "exec", f"{TAG}-br", "curl", "-sSf", "--max-time", "30", "-o", os.path.join(T, "got.safetensors"),
                  "-H", f"Authorization: Bearer {api_token}",
                  f"http://{coord.ip}:{coord.port('http')}/v1/jobs/{m.group(1)}/checkpoint"])
        eq = sh([PY, os.path.join(HERE, "netns", "st_equal.py"), os.path.join(T, "got.safetensors"),
                 os.path.join(T, "ref.safetensors")]) if not ref.returncode and not got.returncode else None
        check("its checkpoint equals `pipewright train`'s bit for bit", eq is not None and eq.returncode == 0,
              (ref.stderr[-300:], got.stderr[-300:], eq and (eq.stdout + eq.stderr)[-300:]))

        # a second pod of the Job, as one that replaces a lost pod: the same
        # key gets the same training job back, followed to its end
        again = Pod("pipewright-train-example-q4m8s", job["spec"]["template"], client.node, client.ip, job)
        again.cg = Cgroup(f"{TAG}-{again.name}", cpus=64, memory=bytes_of(again.c["resources"]["limits"]["memory"]))
        again.cg = again.cg if again.cg.ok else None
        pods.append(again)
        start(T, again, secret, hosts, base_env)
        try:
            again.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            again.proc.kill()
            again.proc.wait()
        out2 = open(again.log, errors="replace").read()
        m2 = re.search(r"submitted as job (\d+)", out2)
        jobs = (api("/v1/jobs") or {}).get("jobs", [])
        check("a second pod of the Job follows the same job and exits 0",
              again.proc.returncode == 0 and m2 and m2.group(1) == m.group(1) and len(jobs) == 1,
              (again.proc.returncode, out2[-300:], len(jobs)))

    # 4. NetworkPolicy: what the run did is allowed, the rest is not
    pol = [o for o in OBJS if o["kind"] == "NetworkPolicy"]
    for src, dst, port, want in ([(w, coord, p, True) for w in workers for p in ("control", "http")] +
                                 [(client, coord, "http", True)] +
                                 [(a, b, "data", True) for a in workers for b in workers if a is not b] +
                                 [(client, workers[0], "data", False), (client, coord, "control", False)]):
        got = allowed(pol, src, dst, dst.port(port))
        check(f"NetworkPolicy {'allows' if want else 'refuses'} {src.name} -> {dst.name}:{port}", got == want)

    # 5. SIGTERM, as a pod's deletion sends it
    for p in workers + [coord]:
        p.proc.send_signal(signal.SIGTERM)
        grace = p.spec.get("terminationGracePeriodSeconds", 30)
        try:
            rc = p.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            rc = "still running after the grace period"
        check(f"{p.name} exits 0 on SIGTERM", rc == 0, rc)
    if no_cgroup:
        SKIPPED.append(f"cores and memory as the limits give them: {no_cgroup}")


def cpu_of(q):
    q = str(q)
    return int(q[:-1]) / 1000 if q.endswith("m") else float(q)


def bytes_of(q):
    q = str(q)
    for suf, mul in (("Ki", 1 << 10), ("Mi", 1 << 20), ("Gi", 1 << 30), ("Ti", 1 << 40), ("k", 10**3), ("M", 10**6),
                     ("G", 10**9), ("T", 10**12)):
        if q.endswith(suf):
            return int(float(q[:-len(suf)]) * mul)
    return int(q)


def wait(cond, timeout):
    t0 = time.time()
    while time.time() - t0 < timeout:
        v = cond()
        if v:
            return v
        time.sleep(0.1)
    return None


def exited(p):
    rc = p.proc.poll()
    return f"{p.name} exited with status {rc}" if rc is not None else None


def describe(pr):
    return ("httpGet " + pr["httpGet"]["path"]) if "httpGet" in pr else "tcpSocket" if "tcpSocket" in pr else str(pr)


def probe(p, pr):
    """One probe from the node, as the kubelet makes it: True on success."""
    if "httpGet" in pr:
        g = pr["httpGet"]
        url = f"{g.get('scheme', 'HTTP').lower()}://{p.ip}:{p.port(g['port'])}{g.get('path', '/')}"
        r = sh(["ip", "netns", "exec", f"{TAG}-br", "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}",
                "--max-time", str(pr.get("timeoutSeconds", 1)), url])
        return r.stdout.isdigit() and 200 <= int(r.stdout) < 400
    if "tcpSocket" in pr:
        port = p.port(pr["tcpSocket"]["port"])
        r = sh(["ip", "netns", "exec", f"{TAG}-br", "timeout", str(pr.get("timeoutSeconds", 1)), "bash", "-c",
                f"exec 3<>/dev/tcp/{p.ip}/{port}"])
        return r.returncode == 0
    fail(f"probe {pr}: neither httpGet nor tcpSocket")


def api_get(coord, path, token):
    """The API from the node (the test's view of the cluster)."""
    r = sh(["ip", "netns", "exec", f"{TAG}-br", "curl", "-sS", "--max-time", "10", "-H", f"Authorization: Bearer {token}",
            f"http://{coord.ip}:{coord.port('http')}{path}"])
    try:
        return json.loads(r.stdout)
    except ValueError:
        return None


def allowed(policies, src, dst, port):
    """Ingress from pod src to dst:port under the NetworkPolicies (pod
    selectors and ports, the kinds these manifests use)."""
    mine = [p for p in policies if p["metadata"].get("namespace") == dst.ns and
            labels_match(p["spec"]["podSelector"].get("matchLabels"), dst.labels) and
            "Ingress" in p["spec"].get("policyTypes", ["Ingress"])]
    if not mine:
        return True
    for p in mine:
        for rule in p["spec"].get("ingress", []):
            peers = rule.get("from")
            ok_from = not peers or any("podSelector" in f and labels_match(f["podSelector"].get("matchLabels"), src.labels)
                                       and "namespaceSelector" not in f for f in peers)
            ports = rule.get("ports")
            ok_port = not ports or any(dst.port(q["port"]) == port and q.get("protocol", "TCP") == "TCP" for q in ports)
            if ok_from and ok_port:
                return True
    return False


def start(T, p, secret, hosts, base_env):
    """The pod's container, started as the kubelet would start it."""
    d = os.path.join(T, p.name)
    os.makedirs(d)
    sc = p.spec.get("securityContext") or {}
    csc = p.c.get("securityContext") or {}
    uid, gid, fsg = csc.get("runAsUser", sc.get("runAsUser", 0)), csc.get("runAsGroup", sc.get("runAsGroup", 0)), sc.get("fsGroup")
    if (csc.get("runAsNonRoot", sc.get("runAsNonRoot")) and uid == 0):
        fail(f"{p.name}: runAsNonRoot without a runAsUser (the image's user is not known here)")
    # volumes
    vols = {}
    claims = {c["metadata"]["name"] for c in p.owner["spec"].get("volumeClaimTemplates", [])}
    for v in p.spec.get("volumes", []) + [{"name": c, "claim": True} for c in claims]:
        vd = os.path.join(d, "vol", v["name"])
        os.makedirs(vd)
        if "secret" in v or "configMap" in v:
            src = v.get("secret") or v.get("configMap")
            o = obj("Secret", src["secretName"]) if "secret" in v else obj("ConfigMap", src["name"])
            data = o.get("data") or {}
            items = src.get("items") or [{"key": k, "path": k} for k in data]
            for it in items:
                if it["key"] not in data:
                    fail(f"{p.name}: volume {v['name']}: no key {it['key']}")
                f = os.path.join(vd, it["path"])
                with open(f, "w") as fh:
                    fh.write(data[it["key"]])
                os.chmod(f, it.get("mode", src.get("defaultMode", 0o644)))
                if fsg is not None:
                    os.chown(f, 0, fsg)
            os.chmod(vd, 0o755)
        elif "emptyDir" in v or v.get("claim"):
            if fsg is not None:
                os.chown(vd, 0, fsg)
                os.chmod(vd, 0o2775)
            else:
                os.chmod(vd, 0o777)
        else:
            fail(f"{p.name}: volume {v['name']}: a kind the test does not make ({list(v)})")
        vols[v["name"]] = vd
    binds = [[s, t, True] for s, t in IMAGE]
    for vm in p.c.get("volumeMounts", []):
        if vm["name"] not in vols:
            fail(f"{p.name}: volumeMount {vm['name']} names no volume")
        binds.append([vols[vm["name"]], vm["mountPath"], bool(vm.get("readOnly"))])
    # environment, command, args
    env = {"PATH": IMAGE_PATH, "HOSTNAME": p.name}
    for e in p.c.get("env", []):
        if "value" in e:
            env[e["name"]] = expand(str(e["value"]), env)
        elif "fieldRef" in e.get("valueFrom", {}):
            env[e["name"]] = p.field(e["valueFrom"]["fieldRef"]["fieldPath"])
        else:
            fail(f"{p.name}: env {e['name']}: a source the test does not fill ({e.get('valueFrom')})")
    if p.c.get("envFrom"):
        fail(f"{p.name}: envFrom: not filled by the test")
    if not p.c.get("command"):
        fail(f"{p.name}: no command: the image has no entrypoint (deploy/k8s/Dockerfile)")
    argv = [expand(a, env) for a in p.c["command"] + p.c.get("args", [])]
    own = [f"{p.ip}\t{p.name}.{p.subdomain}.{p.ns}.svc.cluster.local {p.name}" if p.subdomain else f"{p.ip}\t{p.name}"]
    files = {"/etc/hosts": "# Kubernetes-managed hosts file (the test's).\n127.0.0.1\tlocalhost\n::1\tlocalhost\n"
                           + "\n".join(own + hosts) + "\n",
             "/etc/resolv.conf": f"search {p.ns}.svc.cluster.local svc.cluster.local cluster.local\n"
                                 "nameserver 127.0.0.1\noptions ndots:5\n",
             "/etc/hostname": p.name + "\n"}
    spec = {"root": os.path.join(d, "root"), "hostname": p.name, "binds": binds, "files": files,
            "read_only_root": bool(csc.get("readOnlyRootFilesystem")),
            "uid": uid, "gid": gid, "groups": ([fsg] if fsg is not None else []) + sc.get("supplementalGroups", []),
            "cwd": p.c.get("workingDir", "/"), "argv": argv, "env": {**env, **base_env}}
    with open(os.path.join(d, "spec.json"), "w") as f:
        json.dump(spec, f)
    p.log = os.path.join(d, "log")
    cmd = (p.cg.prefix if p.cg else []) + ["ip", "netns", "exec", f"{TAG}-h{pods_index(p)}", "unshare", "--mount",
                                           "--uts", "--cgroup", "--propagation", "private", "--", PY,
                                           os.path.join(HERE, "netns", "k8s_pod.py"), os.path.join(d, "spec.json")]
    # into the cgroup before `ip netns exec`, whose own /sys has no cgroup mounts
    p.proc = subprocess.Popen(cmd, stdout=open(p.log, "w"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                              preexec_fn=p.cg.enter if p.cg else None)
    print(f"  {p.name} on {p.node} at {p.ip}: {' '.join(argv)[:160]}", flush=True)


def pods_index(p):
    return int(p.ip.rsplit(".", 1)[1]) - 10


t_start = time.time()
main()
print(f"{time.time() - t_start:.1f} s")
if FAILED:
    print(f"FAIL {NAME}")
    sys.exit(1)
if SKIPPED:
    print(f"SKIP {NAME}: everything else passed; not checked: " + "; ".join(SKIPPED))
    sys.exit(77)
print(f"PASS {NAME}")

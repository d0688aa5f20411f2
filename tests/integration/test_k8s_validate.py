#!/usr/bin/env python3
"""test_k8s_validate: deploy/k8s validates against Kubernetes KUBE_VERSION.

  1. Every kustomization.yaml under deploy/k8s names files that exist, and
     every other .yaml there is named by exactly one of them (none is left
     out of what `kubectl apply -k` applies).
  2. Every resource of those files, and each Secret a secretGenerator makes
     (as kustomize renders it), passes kubernetes-validate's strict schema
     of that release: unknown fields are errors, not ignored.
  3. The validator is not a rubber stamp: the worker StatefulSet with a
     misspelt field, and with a port that is not a number or a name, fail.
Usage: test_k8s_validate.py SOURCE_DIR"""
import base64, copy, os, sys

import kubernetes_validate
import yaml

KUBE_VERSION = "1.33.0"  # the release the manifests are written for (docs/deploy.md)
SRC = os.path.abspath(sys.argv[1])
TOP = os.path.join(SRC, "deploy", "k8s")
FAILED = 0


def check(label, ok, detail=""):
    global FAILED
    print(f"{'ok  ' if ok else 'FAIL'} {label}{(': ' + str(detail)) if detail and not ok else ''}", flush=True)
    FAILED += not ok
    return ok


def valid(doc):
    """None when doc validates strictly, else why."""
    try:
        got = kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        return f"{'.'.join(str(p) for p in e.path)}: {e.message}"
    except kubernetes_validate.SchemaNotFoundError as e:
        return f"no schema: {e}"
    if got != KUBE_VERSION.rsplit(".", 1)[0]:
        return f"validated against {got}, not {KUBE_VERSION}"
    return None


named, kustomizations, docs = {}, [], []
for d, _, files in os.walk(TOP):
    for f in files:
        if f == "kustomization.yaml":
            kustomizations.append(os.path.join(d, f))
for k in sorted(kustomizations):
    kz = yaml.safe_load(open(k))
    base = os.path.dirname(k)
    rel = os.path.relpath(k, SRC)
    check(f"{rel}: a Kustomization", kz.get("kind") == "Kustomization" and
          kz.get("apiVersion") == "kustomize.config.k8s.io/v1beta1", kz.get("kind"))
    for r in kz.get("resources", []):
        p = os.path.normpath(os.path.join(base, r))
        if check(f"{rel}: resource {r} exists", os.path.isfile(p)):
            named.setdefault(p, []).append(rel)
            docs += [(os.path.relpath(p, SRC), x) for x in yaml.safe_load_all(open(p)) if x]
    for g in kz.get("secretGenerator", []):  # as kustomize renders it, with stand-in values
        data = {os.path.basename(f.split("=")[-1]): base64.b64encode(b"0" * 64).decode() for f in g.get("files", [])}
        docs.append((f"{rel} secretGenerator", {"apiVersion": "v1", "kind": "Secret", "type": g.get("type", "Opaque"),
                                                "metadata": {"name": g["name"], "namespace": kz.get("namespace")},
                                                "data": data}))
for d, _, files in os.walk(TOP):
    for f in files:
        p = os.path.join(d, f)
        if f.endswith(".yaml") and f != "kustomization.yaml":
            check(f"{os.path.relpath(p, SRC)} is applied by one kustomization", len(named.get(p, [])) == 1,
                  named.get(p, "by none"))

kinds = {}
for where, doc in docs:
    why = valid(doc)
    name = f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
    check(f"{where}: {name} is a valid Kubernetes {KUBE_VERSION} object", why is None, why)
    kinds[name] = doc
for want in ("StatefulSet/pipewright-coordinator", "StatefulSet/pipewright-worker", "Service/pipewright-api",
             "Service/pipewright-control", "NetworkPolicy/pipewright-coordinator", "Job/pipewright-train-example",
             "Secret/pipewright-tokens"):
    check(f"{want} is among them", want in kinds)

# 3. the validator refuses what is wrong
sts = kinds.get("StatefulSet/pipewright-worker")
if sts:
    bad = copy.deepcopy(sts)
    bad["spec"]["replica"] = bad["spec"].pop("replicas")
    check("a misspelt field (spec.replica) is refused", valid(bad) is not None)
    bad = copy.deepcopy(sts)
    bad["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "data"
    check("a containerPort that is not a number is refused", valid(bad) is not None)
print(f"{len(docs)} objects checked against Kubernetes {KUBE_VERSION}")
print(("FAIL" if FAILED else "PASS") + " test_k8s_validate")
sys.exit(1 if FAILED else 0)

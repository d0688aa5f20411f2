#!/usr/bin/env python3
"""test_openapi: api/openapi.yaml is the REST API's contract, and stays true.

  1. The route table of coordinator/api.c and the spec's paths are the same
     set of (method, path), both ways; every $ref resolves; every operation
     documents a 2xx answer and only Error-shaped error answers.
  2. A real pipewright-coordinator (token required) is asked every route,
     happy and unhappy (bad JSON, invalid spec, unknown job, wrong method,
     huge body, long URL, no token...). Every answer's status must be
     documented for its operation, its content type must match, and JSON
     bodies must validate against the documented schema (OpenAPI 3.0
     `nullable` honoured; the job spec against api/job.schema.json).
  3. With two real pipewright-workers, a tiny job runs to the end, so the
     views with data in them (ranks, attempts, ETA, metrics, events, the
     measured timeline, the Chrome trace, the checkpoint) are validated as
     well; a live or succeeded job is not retried, a cancelled one is.

The Contract class is importable: other tests may check their own answers
with Contract(SOURCE_DIR).check(method, path, status, headers, body).
Usage: test_openapi.py BUILD_DIR SOURCE_DIR (exit 77: skipped)."""
import copy, http.client, json, os, re, shutil, struct, subprocess, sys, tempfile, time

try:
    import jsonschema
    import yaml
except ImportError as e:  # pragma: no cover
    print(f"SKIP test_openapi: {e} (Debian: python3-jsonschema, python3-yaml)")
    sys.exit(77)

METHODS = ("get", "post", "put", "delete", "patch")


def code_routes(src):
    """(METHOD, pattern) of every entry of pw_api_routes[] in coordinator/api.c."""
    text = open(os.path.join(src, "coordinator", "api.c")).read()
    m = re.search(r"pw_api_routes\[\]\s*=\s*\{(.*?)\n\};", text, re.S)
    if not m:
        raise SystemExit("cannot find pw_api_routes[] in coordinator/api.c")
    routes = re.findall(r'\{\s*"([A-Z]+)"\s*,\s*"([^"]+)"\s*,', m.group(1))
    if not routes:
        raise SystemExit("pw_api_routes[] has no entries I can read")
    return routes


def openapi_to_jsonschema(node):
    """OpenAPI 3.0 schema objects -> JSON Schema: `nullable: true` becomes a
    null alternative; everything else is already JSON Schema."""
    if isinstance(node, list):
        return [openapi_to_jsonschema(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {k: openapi_to_jsonschema(v) for k, v in node.items() if k not in ("nullable", "example")}
    if node.get("nullable"):
        if "type" in out and "$ref" not in out:
            t = out["type"]
            out["type"] = (t if isinstance(t, list) else [t]) + ["null"]
            if "enum" in out:
                out["enum"] = out["enum"] + [None]
        else:
            out = {"anyOf": [out, {"type": "null"}]}
    return out


class Contract:
    def __init__(self, src):
        self.src = src
        path = os.path.join(src, "api", "openapi.yaml")
        self.raw = yaml.safe_load(open(path))
        self.doc = openapi_to_jsonschema(self.raw)
        self.base = "file://" + path
        job_uri = "file://" + os.path.join(src, "api", "job.schema.json")
        self.job_schema = json.load(open(os.path.join(src, "api", "job.schema.json")))
        self.resolver = jsonschema.RefResolver(self.base, self.doc, store={job_uri: self.job_schema})
        self.templates = []
        for p in self.raw["paths"]:
            rx = "^" + re.escape(p).replace(r"\{ds\}", "[0-9a-f]{64}").replace(r"\{ck\}", "[0-9a-f]{64}")
            rx = rx.replace(r"\{name\}", "[A-Za-z0-9_-]{1,64}") + "$"
            rx = re.sub(r"\\\{[a-z_]+\\\}", r"[0-9]+", rx)
            self.templates.append((re.compile(rx), p))

    def spec_routes(self):
        return [(m.upper(), p) for p, item in self.raw["paths"].items() for m in item if m in METHODS]

    def template(self, path):
        path = path.split("?", 1)[0]
        for rx, p in self.templates:
            if rx.match(path):
                return p
        return None

    def deref(self, node):
        while isinstance(node, dict) and "$ref" in node and node["$ref"].startswith("#/"):
            target = self.raw
            for part in node["$ref"][2:].split("/"):
                target = target[part] if not isinstance(target, list) else target[int(part)]
            node = target
        return node

    def validate(self, schema, value, where):
        v = jsonschema.Draft202012Validator(schema, resolver=self.resolver)
        errs = sorted(v.iter_errors(value), key=lambda e: list(e.absolute_path))
        if errs:
            e = errs[0]
            raise AssertionError(f"{where}: {'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message[:300]}")

    def check(self, method, path, status, headers, body):
        """Raises AssertionError unless the answer is one the spec documents."""
        where = f"{method} {path} -> {status}"
        tpl = self.template(path)
        if tpl is None:
            assert status in (401, 404), f"{where}: undocumented path answered other than 401/404"
            return self.validate({"$ref": "#/components/schemas/Error"}, json.loads(body), where)
        item = self.raw["paths"][tpl]
        op = item.get(method.lower())
        if op is None:  # a known path, an undocumented method: 405 with Allow
            assert status in (401, 405), f"{where}: expected 405"
            if status == 405:
                allow = {m.strip() for m in headers.get("allow", "").split(",")}
                want = {m.upper() for m in item if m in METHODS} | ({"HEAD"} if "get" in item else set())
                assert allow == want, f"{where}: Allow {allow} != {want}"
            return self.validate({"$ref": "#/components/schemas/Error"}, json.loads(body), where)
        resp = op["responses"].get(str(status))
        assert resp is not None, f"{where}: status not documented (documented: {sorted(op['responses'])})"
        resp = self.deref(resp)
        for h in resp.get("headers", {}):
            assert h.lower() in headers, f"{where}: documented header {h} missing"
        content = resp.get("content")
        if not content:
            return
        ctype = headers.get("content-type", "").split(";")[0].strip()
        assert ctype in content, f"{where}: content type {ctype!r} not documented ({list(content)})"
        if ctype == "application/json":
            schema = content[ctype]["schema"]
            self.validate(openapi_to_jsonschema(schema), json.loads(body), where)


def static_checks(c, src):
    code = set(code_routes(src))
    spec = set(c.spec_routes())
    missing, extra = code - spec, spec - code
    assert not missing, f"routes in coordinator/api.c missing from api/openapi.yaml: {sorted(missing)}"
    assert not extra, f"routes in api/openapi.yaml that the code does not have: {sorted(extra)}"
    print(f"ok   {len(code)} routes: code and spec agree")

    def walk(node, where):
        if isinstance(node, dict):
            r = node.get("$ref")
            if isinstance(r, str):
                if r.startswith("#/"):
                    c.deref({"$ref": r})  # raises KeyError if it dangles
                else:
                    assert os.path.exists(os.path.join(src, "api", r)), f"{where}: $ref {r} dangles"
            for k, v in node.items():
                walk(v, f"{where}/{k}")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{where}/{i}")
    walk(c.raw, "")
    jsonschema.Draft202012Validator.check_schema(openapi_to_jsonschema(c.raw["components"]["schemas"]["Error"]))
    for p, item in c.raw["paths"].items():
        for m, op in item.items():
            if m not in METHODS:
                continue
            codes = op["responses"]
            ok = [s for s in codes if s.startswith("2")]
            assert ok, f"{m.upper()} {p}: no 2xx answer documented"
            assert "405" in codes and "414" in codes, f"{m.upper()} {p}: 405/414 not documented"
            if op.get("security", c.raw.get("security")):
                assert "401" in codes, f"{m.upper()} {p}: needs a token but 401 is not documented"
            if "{id}" in p:
                assert "404" in codes, f"{m.upper()} {p}: 404 not documented"
            if "requestBody" in op:
                # 422 is for a body that parses but says something invalid:
                # JSON bodies; a binary upload may have no such answer
                json_body = "application/json" in op["requestBody"].get("content", {})
                for s in ("400", "413") + (("422",) if json_body else ()):
                    assert s in codes, f"{m.upper()} {p}: takes a body but {s} is not documented"
            for s, r in codes.items():
                if s.startswith("2"):
                    continue
                schema = c.deref(r)["content"]["application/json"]["schema"]
                assert schema == {"$ref": "#/components/schemas/Error"}, f"{m.upper()} {p} {s}: not the Error shape"
    print("ok   every $ref resolves; every operation documents its answers")


class Client:
    def __init__(self, port, token, contract):
        self.port, self.token, self.c = port, token, contract
        self.seen = set()

    def raw(self, method, path, body=None, headers=None, token=True):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        hd = dict(headers or {})
        if token and self.token:
            hd["Authorization"] = "Bearer " + self.token
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        conn.request(method, path, body=body, headers=hd)
        r = conn.getresponse()
        data = r.read()
        hs = {k.lower(): v for k, v in r.getheaders()}
        conn.close()
        return r.status, hs, data

    def call(self, method, path, body=None, status=200, headers=None, token=True):
        st, hs, data = self.raw(method, path, body, headers, token)
        assert st == status, f"{method} {path}: {st} (wanted {status}): {data[:300]!r}"
        self.c.check(method, path, st, hs, data)
        tpl = self.c.template(path)
        self.seen.add((method, tpl, st))
        print(f"ok   {method} {path[:70]} -> {st}")
        ctype = hs.get("content-type", "")
        return (json.loads(data) if ctype.startswith("application/json") else data), hs


def wait_file(path, proc, timeout=30):
    t = time.time() + timeout
    while time.time() < t:
        if os.path.exists(path):
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.05)
    return False


TINY = {"name": "openapi-tiny",
        "model": {"template": "gpt", "vocab_size": 256, "seq_len": 8, "d_model": 16, "n_layers": 2, "n_heads": 2},
        "mesh": {"pp": 2}, "schedule": {"name": "1f1b", "microbatches": 2},
        "train": {"steps": 6, "batch_size": 4, "checkpoint_every": 3},
        "data": {"kind": "text", "path": "examples/data/corpus.txt"}}


def analytics_checks(cl, build):
    """GET /v1/schedules/{name}/analytics: the issue's figures at p = 4,
    m = 8, what `pipewright schedules` prints for the same, and each
    refusal naming its parameter."""
    an = "/v1/schedules/{}/analytics?{}"
    want = {("1f1b", "pp=4&m=8"): 3 / 11, ("zb-h1", "pp=4&m=8"): 3 / 27,
            ("ZeroBubbleH1", "pp=4&m=8"): 3 / 27, ("interleaved-1f1b", "pp=4&m=8&v=2"): 3 / 19,
            ("interleaved-1f1b", "pp=4&m=8"): 3 / 19}  # v defaults to the schedule's least, 2
    for (name, q), b in want.items():
        j, _ = cl.call("GET", an.format(name, q))
        assert abs(j["bubble_ratio"] - b) < 1e-12 and abs(j["closed_form"]["bubble_ratio"] - b) < 1e-12, (name, j)
    cli = os.path.join(build, "pipewright")
    j, _ = cl.call("GET", an.format("interleaved-1f1b", "pp=4&m=8&costs=1,3,1.5,1.5"))
    out = subprocess.run([cli, "schedules", "interleaved-1f1b", "--pp", "4", "--m", "8", "--costs", "1,3,1.5,1.5",
                          "--json"], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == j, (out[:300], j)
    assert j["closed_form"] is None and j["total_steps"] == 19 * 4, j
    err, _ = cl.call("GET", an.format("1f1c", "pp=4&m=8"), status=404)
    assert err["error"]["path"] == "name" and "did you mean 1f1b?" in err["error"]["message"], err
    for q, path, status in (("pp=4", "m", 400), ("pp=x&m=8", "pp", 400), ("pp=4&m=8&costs=1,2,1", "costs", 400),
                            ("pp=4&m=8&costs=1,0,1,1", "costs", 400), ("pp=65&m=8", "pp", 422),
                            ("pp=4&m=2000", "m", 422), ("pp=4&m=8&v=2", "v", 422)):
        err, _ = cl.call("GET", an.format("1f1b", q), status=status)
        assert err["error"]["path"] == path, (q, err)
    err, _ = cl.call("GET", an.format("dualpipev", "pp=4&m=5"), status=422)
    assert err["error"] == {"code": "invalid_spec", "path": "m",
                            "message": "dualpipev needs microbatches >= 2*pp (got 5 < 8)"}, err
    cl.call("POST", an.format("1f1b", "pp=4&m=8"), "{}", status=405)
    print("ok   schedule analytics: 3/11, 3/27, 3/19 at p = 4, m = 8; the CLI prints the same; refusals name the parameter")


def live_checks(cl, src):
    cl.call("GET", "/healthz", token=False)
    cl.call("GET", "/metrics")
    cl.call("GET", "/metrics", token=False, status=401)
    cl.call("GET", "/v1/jobs", headers={"Authorization": "Bearer nope"}, token=False, status=401)
    cl.call("GET", "/v1/workers")
    cl.call("GET", "/v1/schedules")

    example = json.load(open(os.path.join(src, "examples", "jobs", "gpt-tiny.json")))
    plan, _ = cl.call("POST", "/v1/plans", example)
    assert plan["schedule"] == example["schedule"]["name"]
    cl.call("POST", "/v1/plans?compare=1", example)
    cl.call("POST", "/v1/plans?schedule=gpipe", example)
    cl.call("POST", "/v1/plans", '{"model": ', status=400)
    bad = copy.deepcopy(example)
    bad["model"]["n_heads"] = 5
    err, _ = cl.call("POST", "/v1/plans", bad, status=422)
    assert err["error"]["path"].startswith("model."), err
    cl.call("POST", "/v1/plans?compare=2", example, status=400)

    ids = []
    for f in sorted(os.listdir(os.path.join(src, "examples", "jobs"))):
        if f.endswith(".json"):
            spec = json.load(open(os.path.join(src, "examples", "jobs", f)))
            if "init" in spec:  # starts from another job's step, which this coordinator does not hold
                err, _ = cl.call("POST", "/v1/jobs", spec, status=422)
                assert err["error"]["path"] == "init.step", (f, err)
                continue
            made, hs = cl.call("POST", "/v1/jobs", spec, status=201)
            assert hs["location"] == f"/v1/jobs/{made['id']}"
            ids.append(made["id"])
    bad = copy.deepcopy(example)
    bad["train"]["steps"] = "many"
    err, _ = cl.call("POST", "/v1/jobs", bad, status=422)
    assert err["error"]["path"] == "train.steps", err
    cl.call("POST", "/v1/jobs", "[", status=400)
    cl.call("POST", "/v1/jobs", "", status=400)

    lst, _ = cl.call("GET", "/v1/jobs")
    assert lst["total"] >= len(ids)
    cl.call("GET", "/v1/jobs?state=queued&limit=2&offset=1")
    cl.call("GET", "/v1/jobs?limit=0", status=400)
    cl.call("GET", "/v1/jobs?state=nope", status=400)

    j = ids[0]
    cl.call("GET", f"/v1/jobs/{j}")
    # reals as written: examples/jobs/gpt-pp4.json's lr 3e-3 reads 0.003, not 0.0030000000000000001
    _, _, text = cl.raw("GET", f"/v1/jobs/{j}", None, None, True)
    text = text.decode() if isinstance(text, bytes) else text
    assert '"lr":0.003,' in text and "0.0030000000000000001" not in text, text[:400]
    print("ok   reals in replies are the shortest that read back the same (lr 0.003)")
    cl.call("GET", f"/v1/jobs/{j}/metrics")
    cl.call("GET", f"/v1/jobs/{j}/metrics?since=x", status=400)
    cl.call("GET", f"/v1/jobs/{j}/events")
    cl.call("GET", f"/v1/jobs/{j}/events?since=1")
    tl, _ = cl.call("GET", f"/v1/jobs/{j}/timeline")
    assert tl["planned"] is not None
    # nothing sampled yet: the 404 says so, and its "sampled" is empty
    err, _ = cl.call("GET", f"/v1/jobs/{j}/timeline?step=3", status=404)
    assert err["error"]["sampled"] == [] and err["error"]["path"] == "step", err
    assert err["error"]["message"] == f"step 3 of job {j} was not sampled; no step has been sampled yet", err
    err, _ = cl.call("GET", f"/v1/jobs/{j}/timeline?format=chrome", status=404)
    assert err["error"]["sampled"] == [] and "no sampled steps yet" in err["error"]["message"], err
    cl.call("GET", f"/v1/jobs/{j}/timeline?format=svg", status=400)
    cl.call("GET", f"/v1/jobs/{j}/checkpoint", status=404)
    err, _ = cl.call("POST", f"/v1/jobs/{j}/retry", status=409)  # queued: nothing to retry
    assert "is queued" in err["error"]["message"], err
    for i in ids:
        cl.call("DELETE", f"/v1/jobs/{i}")
    cl.call("DELETE", f"/v1/jobs/{j}", status=409)
    retry_checks(cl, j)
    for sub in ("", "/metrics", "/events", "/events.tfevents", "/timeline", "/checkpoint"):
        cl.call("GET", f"/v1/jobs/987654{sub}", status=404)
    cl.call("DELETE", "/v1/jobs/987654", status=404)
    cl.call("POST", "/v1/jobs/987654/retry", status=404)
    cl.call("GET", f"/v1/jobs/{j}/retry", status=405)

    dataset_checks(cl, example)
    weights_checks(cl, example)

    cl.call("PUT", "/v1/jobs", "{}", status=405)
    cl.call("DELETE", "/v1/schedules", status=405)
    cl.call("PATCH", f"/v1/jobs/{j}", "{}", status=405)
    cl.call("GET", "/v1/nothing", status=404)
    cl.call("GET", "/v1/jobs?x=" + "a" * 3000, status=414)
    # a declared body over the bound is refused before it is read
    conn = http.client.HTTPConnection("127.0.0.1", cl.port, timeout=30)
    conn.putrequest("POST", "/v1/jobs")
    conn.putheader("Authorization", "Bearer " + cl.token)
    conn.putheader("Content-Length", str(64 << 20))
    conn.endheaders()
    r = conn.getresponse()
    data = r.read()
    hs = {k.lower(): v for k, v in r.getheaders()}
    conn.close()
    assert r.status == 413, (r.status, data)
    cl.c.check("POST", "/v1/jobs", 413, hs, data)
    print("ok   POST /v1/jobs (64 MiB declared) -> 413")
    st, hs, data = cl.raw("GET", "/", token=False)
    assert st == 200 and hs["content-type"].startswith("text/html"), (st, hs)
    print("ok   GET / (dashboard) -> 200")


def retry_checks(cl, j):
    """POST /v1/jobs/{id}/retry on a cancelled job: queued again, with a
    retry event and no attempts (it never ran); then cancelled again so
    that it never reaches the workers of run_job."""
    again, _ = cl.call("POST", f"/v1/jobs/{j}/retry")
    assert again == {"id": j, "state": "queued", "location": f"/v1/jobs/{j}"}, again
    job, _ = cl.call("GET", f"/v1/jobs/{j}")
    assert job["state"] == "queued" and job["error"] is None and job["finished"] is None, job
    assert job["restarts"] == 0 and job["max_restarts"] == 3 and job["attempts"] == [], job
    ev, _ = cl.call("GET", f"/v1/jobs/{j}/events")
    assert ev["events"][-1]["kind"] == "retry", ev
    cl.call("DELETE", f"/v1/jobs/{j}")


def weights_checks(cl, example):
    """The stored-weights routes: upload (new, again, refused), list, one,
    content, delete, and init naming unknown weights."""
    octet = {"Content-Type": "application/octet-stream"}
    vals = struct.pack("<4f", 1.0, 2.0, 3.0, 4.0)
    hdr = json.dumps({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}).encode()
    hdr += b" " * (-len(hdr) % 8)
    body = struct.pack("<Q", len(hdr)) + hdr + vals
    w, hs = cl.call("POST", "/v1/checkpoints?name=oa", body, status=201, headers=octet)
    assert hs["location"] == "/v1/checkpoints/" + w["id"] and w["size"] == len(body) and w["params"] == 4, w
    again, _ = cl.call("POST", "/v1/checkpoints", body, status=200, headers=octet)
    assert again == w, (again, w)
    cl.call("POST", "/v1/checkpoints", b"", status=400, headers=octet)
    cl.call("POST", "/v1/checkpoints", b"not safetensors", status=400, headers=octet)
    lst, _ = cl.call("GET", "/v1/checkpoints")
    assert w["id"] in [c["id"] for c in lst["checkpoints"]], lst
    one, _ = cl.call("GET", "/v1/checkpoints/" + w["id"])
    assert one == w
    data, hs = cl.call("GET", f"/v1/checkpoints/{w['id']}/content")
    assert data == body and hs["etag"] == f'"{w["id"]}"'
    spec = copy.deepcopy(example)
    spec["init"] = {"checkpoint": w["id"]}
    err, _ = cl.call("POST", "/v1/jobs", spec, status=422)  # the example's parameters are not in it
    assert err["error"]["path"] == "init" and "missing" in err["error"]["message"], err
    gone, _ = cl.call("DELETE", "/v1/checkpoints/" + w["id"])
    assert gone == w
    missing = "0" * 64
    for sub in ("", "/content"):
        cl.call("GET", f"/v1/checkpoints/{missing}{sub}", status=404)
    cl.call("DELETE", f"/v1/checkpoints/{missing}", status=404)
    spec["init"] = {"checkpoint": missing}
    err, _ = cl.call("POST", "/v1/jobs", spec, status=422)
    assert err["error"]["path"] == "init.checkpoint", err
    cl.call("PUT", "/v1/checkpoints", "{}", status=405)


def dataset_checks(cl, example):
    """The dataset routes: upload (new, again), list, one, content, delete
    (refused while a queued job reads it), and their errors."""
    octet = {"Content-Type": "application/octet-stream"}
    body = b"openapi dataset bytes\n" * 100
    ds, hs = cl.call("POST", "/v1/datasets?name=oa", body, status=201, headers=octet)
    assert hs["location"] == "/v1/datasets/" + ds["id"] and ds["size"] == len(body) and ds["format"] == "text", ds
    again, _ = cl.call("POST", "/v1/datasets?name=other", body, status=200, headers=octet)
    assert again == ds, (again, ds)
    cl.call("POST", "/v1/datasets", b"", status=400, headers=octet)
    cl.call("POST", "/v1/datasets?name=", b"x", status=400, headers=octet)
    cl.call("POST", "/v1/datasets", b"PWTOKENS" + b"\0" * 40, status=400, headers=octet)
    lst, _ = cl.call("GET", "/v1/datasets")
    assert ds["id"] in [d["id"] for d in lst["datasets"]], lst
    one, _ = cl.call("GET", "/v1/datasets/" + ds["id"])
    assert one == ds
    data, hs = cl.call("GET", f"/v1/datasets/{ds['id']}/content")
    assert data == body and hs["etag"] == f'"{ds["id"]}"'
    spec = copy.deepcopy(example)
    spec["data"] = {"kind": "text", "dataset": ds["id"]}
    made, _ = cl.call("POST", "/v1/jobs", spec, status=201)
    err, _ = cl.call("DELETE", "/v1/datasets/" + ds["id"], status=409)
    assert str(made["id"]) in err["error"]["message"], err
    cl.call("DELETE", f"/v1/jobs/{made['id']}")
    gone, _ = cl.call("DELETE", "/v1/datasets/" + ds["id"])
    assert gone == ds
    missing = "0" * 64
    for sub in ("", "/content"):
        cl.call("GET", f"/v1/datasets/{missing}{sub}", status=404)
    cl.call("DELETE", f"/v1/datasets/{missing}", status=404)
    spec["data"]["dataset"] = missing
    err, _ = cl.call("POST", "/v1/jobs", spec, status=422)
    assert err["error"]["path"] == "data.dataset", err
    cl.call("PUT", "/v1/datasets", "{}", status=405)
    cl.call("POST", f"/v1/datasets/{missing}", "{}", status=405)
    cl.call("GET", "/v1/datasets/ABC", status=404)
    # a declared upload over --max-upload is refused before it is read
    conn = http.client.HTTPConnection("127.0.0.1", cl.port, timeout=30)
    conn.putrequest("POST", "/v1/datasets")
    conn.putheader("Authorization", "Bearer " + cl.token)
    conn.putheader("Content-Length", str(64 << 30))
    conn.endheaders()
    r = conn.getresponse()
    data = r.read()
    hs = {k.lower(): v for k, v in r.getheaders()}
    conn.close()
    assert r.status == 413, (r.status, data)
    cl.c.check("POST", "/v1/datasets", 413, hs, data)
    print("ok   POST /v1/datasets (64 GiB declared) -> 413")


def job_gauges(cl):
    """/metrics: a running job's last recorded step as pipewright_job_*
    gauges, its name escaped as a label value; gone once it ends."""
    name = 'gauge "q" \\ x'  # (names hold no control characters: no newline to escape)
    made, _ = cl.call("POST", "/v1/jobs", dict(TINY, name=name, data={"kind": "copy"},
                                               train={"steps": 100000, "batch_size": 4}), status=201)
    j = made["id"]
    t = time.time() + 120
    while time.time() < t:
        job = json.loads(cl.raw("GET", f"/v1/jobs/{j}")[2])
        if job["state"] == "running" and job["progress"]["step"] >= 2:
            break
        assert job["state"] in ("queued", "planning", "dispatching", "running"), job
        time.sleep(0.1)
    else:
        raise AssertionError(f"job {j} recorded no steps: {job}")
    text, _ = cl.call("GET", "/metrics")
    text = text.decode() if isinstance(text, bytes) else text
    label = '{job_id="%d",name="gauge \\"q\\" \\\\ x"}' % j
    got = {}
    for line in text.splitlines():
        k, _, v = line.rpartition(" ")
        if k.endswith(label):
            got[k[:-len(label)]] = float(v)
    keys = {"pipewright_job_loss": "loss", "pipewright_job_lr": "lr", "pipewright_job_grad_norm": "grad_norm",
            "pipewright_job_tokens_per_second": "tokens_per_s", "pipewright_job_step_seconds": "step_time"}
    assert sorted(got) == sorted(keys), (label, [ln for ln in text.splitlines() if "pipewright_job_" in ln])
    for g in keys:
        assert "# TYPE %s gauge" % g in text, g
    # beside them, the step its plan predicts (the FLOP model's: no layer_times)
    planned = [ln for ln in text.splitlines()
               if ln.startswith("pipewright_job_planned_step_seconds" + label[:-1] + ',cost_model="flops"} ')]
    assert len(planned) == 1 and float(planned[0].rpartition(" ")[2]) > 0, \
        [ln for ln in text.splitlines() if "planned" in ln]
    # the steps go on meanwhile: the gauges are one recorded row's values, exactly
    rows = cl.call("GET", f"/v1/jobs/{j}/metrics")[0]["metrics"]
    match = [r["step"] for r in rows if all(r[f] == got[g] for g, f in keys.items())]
    assert match and match[-1] >= 1, (got, rows[-3:])
    cl.call("DELETE", f"/v1/jobs/{j}")
    t = time.time() + 60
    while json.loads(cl.raw("GET", f"/v1/jobs/{j}")[2])["state"] != "cancelled" and time.time() < t:
        time.sleep(0.1)
    text, _ = cl.call("GET", "/metrics")
    text = text.decode() if isinstance(text, bytes) else text
    assert 'job_id="%d"' % j not in text, "a finished job keeps no series"
    print(f"ok   /metrics: job {j}'s pipewright_job_* gauges are step {match[-1]}'s row; its name label escaped")


def serve_checks(cl, j):
    """A serve job from TINY's last step: generate as JSON and as an event
    stream, its errors, its cancel (tests/integration/test_serve.py holds
    the tokens to the oracle)."""
    made, _ = cl.call("POST", "/v1/jobs", dict(TINY, name="openapi-serve", mode="serve", init={"job": j, "step": 6},
                                               serve={"max_sequences": 2, "max_queue": 0}), status=201)
    s = made["id"]
    t = time.time() + 60
    while time.time() < t:
        job, _ = cl.call("GET", f"/v1/jobs/{s}")
        if job["state"] == "running" and job.get("status") == "serving":
            break
        time.sleep(0.2)
    out, _ = cl.call("POST", f"/v1/jobs/{s}/generate", {"prompt": "ab", "max_tokens": 3})
    assert len(out["results"][0]["tokens"]) == 3 and "text" in out["results"][0], out
    data, hs = cl.call("POST", f"/v1/jobs/{s}/generate", {"prompt": [97, 98], "max_tokens": 2, "stream": True})
    assert hs["content-type"].startswith("text/event-stream") and b"event: done" in data, data
    err, _ = cl.call("POST", f"/v1/jobs/{s}/generate", {"prompt": "ab", "top_p": 2}, status=422)
    assert err["error"]["path"] == "top_p", err
    err, _ = cl.call("POST", f"/v1/jobs/{s}/generate", {"prompt": ["a", "b", "c"]}, status=429)
    assert err["error"]["path"] == "serve.max_queue", err
    cl.call("POST", f"/v1/jobs/{j}/generate", {"prompt": "ab"}, status=409)
    cl.call("DELETE", f"/v1/jobs/{s}")


def run_job(cl, build, tmp, ctl_port):
    """Two real workers run TINY; every view with data is validated."""
    procs = []
    try:
        for i in range(2):
            log = open(os.path.join(tmp, f"w{i}.log"), "w")
            procs.append(subprocess.Popen(
                [os.path.join(build, "pipewright-worker"), "--coordinator", f"127.0.0.1:{ctl_port}",
                 "--listen", "127.0.0.1:0", "--name", f"oa{i}", "--state-dir", os.path.join(tmp, f"w{i}")],
                stdout=log, stderr=subprocess.STDOUT))
        t = time.time() + 30
        while time.time() < t:
            ws, _ = cl.call("GET", "/v1/workers")
            if sum(w["state"] == "idle" for w in ws["workers"]) >= 2:
                break
            time.sleep(0.2)
        else:
            raise AssertionError("the workers did not register")
        # synthetic data: the views are checked here, not how workers get datasets
        tiny = dict(TINY, data={"kind": "copy"})
        made, _ = cl.call("POST", "/v1/jobs", tiny, status=201)
        j = made["id"]
        t = time.time() + 120
        live_retry = False
        while time.time() < t:
            st, _, data = cl.raw("GET", f"/v1/jobs/{j}")
            job = json.loads(data)
            if job["state"] in ("succeeded", "failed", "cancelled"):
                break
            if not live_retry:  # a live job is not retried (nor once it succeeds meanwhile)
                cl.call("POST", f"/v1/jobs/{j}/retry", status=409)
                live_retry = True
            time.sleep(0.2)
        assert job["state"] == "succeeded", f"job {j} ended {job['state']}: {job.get('error')}"
        job, _ = cl.call("GET", f"/v1/jobs/{j}")
        assert len(job["ranks"]) == 2 and job["eta_seconds"] == 0, job
        assert job["restarts"] == 0 and len(job["attempts"]) == 1, job["attempts"]
        a = job["attempts"][0]
        assert a["attempt"] == 1 and a["run"] == job["run"] and a["state"] == "succeeded", a
        assert sorted(a["workers"]) == ["oa0", "oa1"] and a["finished"] is not None, a
        err, _ = cl.call("POST", f"/v1/jobs/{j}/retry", status=409)
        assert "is succeeded: only a failed or cancelled job" in err["error"]["message"], err
        m, _ = cl.call("GET", f"/v1/jobs/{j}/metrics")
        assert len(m["metrics"]) == TINY["train"]["steps"], m
        cl.call("GET", f"/v1/jobs/{j}/metrics?since=3")
        text, hs = cl.call("GET", f"/v1/jobs/{j}/metrics?format=csv")
        assert text.decode().startswith("step,loss,") and "attachment" in hs["content-disposition"], text[:200]
        text, _ = cl.call("GET", f"/v1/jobs/{j}/metrics?format=jsonl&all=1")
        assert len(text.decode().splitlines()) == TINY["train"]["steps"], text[:200]
        err, _ = cl.call("GET", f"/v1/jobs/{j}/metrics?format=xml", status=400)
        assert err["error"]["path"] == "format" and "json, csv, jsonl" in err["error"]["message"], err
        tf, hs = cl.call("GET", f"/v1/jobs/{j}/events.tfevents")
        assert "tfevents" in hs["content-disposition"] and len(tf) > 16, hs
        cl.call("GET", f"/v1/jobs/{j}/events")
        tl, _ = cl.call("GET", f"/v1/jobs/{j}/timeline")
        if tl["steps"]:
            assert tl["ranks"] and tl["bubble"]["measured"] is not None, tl
            cl.call("GET", f"/v1/jobs/{j}/timeline?step={tl['steps'][0]}")
            # a step not sampled: the 404 names those that were (few here: all of them)
            err, _ = cl.call("GET", f"/v1/jobs/{j}/timeline?step=999999", status=404)
            assert err["error"]["sampled"] == tl["steps"], (err, tl["steps"])
            listed = ", ".join(map(str, tl["steps"]))
            assert err["error"]["message"] == f"step 999999 of job {j} was not sampled; sampled steps: {listed}", err
            tr, hs = cl.call("GET", f"/v1/jobs/{j}/timeline?format=chrome")
            assert "attachment" in hs["content-disposition"]
            assert any(e["ph"] == "X" for e in tr["traceEvents"])
        else:
            print("note the job sampled no timings: the measured timeline is not checked")
        data, hs = cl.call("GET", f"/v1/jobs/{j}/checkpoint")
        assert "attachment" in hs["content-disposition"] and ".safetensors" in hs["content-disposition"]
        n = struct.unpack("<Q", data[:8])[0]
        header = json.loads(data[8:8 + n])
        names = [k for k in header if k != "__metadata__"]
        assert "embed.tok.weight" in names and "blocks.1.mlp.fc.weight" in names, names
        step = re.search(r"step-([0-9]+)\.safetensors", hs["content-disposition"]).group(1)
        assert header["__metadata__"]["step"] == step, (header["__metadata__"], hs["content-disposition"])
        # the coordinator's copy: the retained steps, one stored shard each
        # way, a step's optimizer state; the ranks' PUTs made them (their
        # 201s are what the listing shows)
        cks, _ = cl.call("GET", f"/v1/jobs/{j}/checkpoints")
        steps = [c["step"] for c in cks["checkpoints"]]
        assert steps == [3, 6], cks
        for tpl in ("/v1/jobs/{id}/runs/{run}/checkpoints/{step}/stages/{stage}",
                    "/v1/jobs/{id}/runs/{run}/checkpoints/{step}/stages/{stage}/optimizer"):
            cl.seen.add(("PUT", tpl, 201))
        cl.call("GET", f"/v1/jobs/{j}/checkpoints/3/stages/1")
        cl.call("GET", f"/v1/jobs/{j}/checkpoints/3/stages/0/optimizer")
        cl.call("GET", f"/v1/jobs/{j}/checkpoints/4/stages/0", status=404)
        data, _ = cl.call("GET", f"/v1/jobs/{j}/checkpoint?step=3&optimizer=1")
        n = struct.unpack("<Q", data[:8])[0]
        assert any(k.startswith("exp_avg_sq.") for k in json.loads(data[8:8 + n])), "no optimizer state"
        cl.call("GET", f"/v1/jobs/{j}/checkpoint?step=4", status=404)
        cl.call("GET", "/v1/workers")
        job_gauges(cl)
        serve_checks(cl, j)
        cl.call("DELETE", f"/v1/jobs/{j}", status=409)
        cl.call("DELETE", f"/v1/jobs/{j}?purge=1")
        cl.call("GET", f"/v1/jobs/{j}/checkpoint", status=404)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


def main():
    build, src = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    c = Contract(src)
    static_checks(c, src)
    exe = os.path.join(build, "pipewright-coordinator")
    if not os.access(exe, os.X_OK):
        print(f"SKIP test_openapi: no {exe}")
        sys.exit(77)
    tmp = tempfile.mkdtemp(prefix="pw-openapi-")
    tok = os.path.join(tmp, "token")
    with open(os.open(tok, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
        f.write("openapi-test-token\n")
    ready = os.path.join(tmp, "ready.json")
    log = open(os.path.join(tmp, "coordinator.log"), "w")
    # The examples' data under a root of the test's own: the corpus, and the
    # token file gpt-tiny-finetune.json reads, made as its README says.
    root = os.path.join(tmp, "root")
    os.makedirs(os.path.join(root, "examples", "data"))
    shutil.copy(os.path.join(src, "examples", "data", "corpus.txt"), os.path.join(root, "examples", "data"))
    subprocess.run([os.path.join(build, "pipewright"), "dataset", "convert",
                    os.path.join(root, "examples", "data", "corpus.txt"),
                    os.path.join(root, "examples", "data", "corpus.tok")], check=True, stdout=subprocess.DEVNULL)
    coord = subprocess.Popen([exe, "--http", "127.0.0.1:0", "--control", "127.0.0.1:0", "--state-dir",
                              os.path.join(tmp, "state"), "--token-file", tok, "--ready-file", ready,
                              "--data-root", root,
                              "--web", os.path.join(src, "web"), "--heartbeat-timeout", "10"],
                             stdout=log, stderr=subprocess.STDOUT, cwd=src)
    ok = False
    try:
        assert wait_file(ready, coord), "the coordinator did not start: " + open(log.name).read()[-2000:]
        ports = json.load(open(ready))
        cl = Client(ports["http"], "openapi-test-token", c)
        live_checks(cl, src)
        analytics_checks(cl, build)
        if os.access(os.path.join(build, "pipewright-worker"), os.X_OK):
            run_job(cl, build, tmp, ports["control"])
        else:
            print("note no pipewright-worker: views with run data are not checked")
        # every documented operation was exercised at least once, with its 2xx
        for m, p in c.spec_routes():
            assert any(s[0] == m and s[1] == p and s[2] < 300 for s in cl.seen), f"{m} {p}: never answered 2xx here"
        ok = True
    finally:
        coord.terminate()
        try:
            coord.wait(15)
        except subprocess.TimeoutExpired:
            coord.kill()
        text = open(log.name, errors="replace").read()
        if not ok:
            print("---- coordinator log (tail) ----")
            print(text[-3000:])
    for bad in ("AddressSanitizer", "LeakSanitizer", "runtime error:"):
        assert bad not in text, f"the coordinator's log has a sanitizer report:\n{text[-3000:]}"
    shutil.rmtree(tmp, ignore_errors=True)
    print("PASS test_openapi")


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        print(f"FAIL {e}")
        sys.exit(1)

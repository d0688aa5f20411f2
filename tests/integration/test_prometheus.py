#!/usr/bin/env python3
"""test_prometheus: the monitoring files of deploy/ against promtool, a live
coordinator and a real Prometheus server.

  1. deploy/prometheus/alerts.yml passes `promtool check rules`, and
     alerts_test.yml `promtool test rules`; alerts_test.yml has, for every
     alert, a case where it fires and one where it does not.
  2. deploy/grafana/pipewright.json: a dashboard whose panels all read the
     datasource variable; every PromQL expression in it parses (promtool,
     as recording rules).
  3. A coordinator and 5 workers run three long jobs (pp 2 under the FLOP
     model; pp 1 costed by partition.layer_times far below any real step,
     and one far above), then two that diverge (sgd lr 1e30: one under
     train.on_nonfinite "fail", one "skip"). Its /metrics passes `promtool
     check metrics`; no series has a label Prometheus sets itself (job,
     instance); pipewright_job_planned_step_seconds is `pipewright plan`'s
     predicted step of each job with the cost_model it was planned with;
     pipewright_steps_nonfinite_total counts 1 failed and 7 skipped steps.
     Every metric the dashboard and the rules name is exported (and a name
     that is not is caught), and every exported one is on the dashboard.
  4. Prometheus, from deploy/prometheus/prometheus.yml (the target and the
     token file replaced), scrapes that coordinator and a second one that
     requires the API token: both up, the series keep job_id (no
     exported_job), every rule evaluates without error, and exactly these
     alerts are active: PipewrightJobSlowerThanPlan pending for the job whose
     plan is far below its steps, PipewrightJobDiverged and
     PipewrightStepsNotFinite firing.
Usage: test_prometheus.py BUILD_DIR SOURCE_DIR"""
import json, os, re, signal, socket, subprocess, sys, tempfile, time, urllib.parse

import yaml

import driver as d

BUILD, SRC = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
PROM = os.path.join(SRC, "deploy/prometheus")
DASH = os.path.join(SRC, "deploy/grafana/pipewright.json")
check = d.Checks()

# Grafana's variables, as a query would see them once substituted.
GRAFANA_VARS = {"$__rate_interval": "1m", "$__interval": "1m", "$__range": "1h", "$instance": ".*"}
PROMQL_WORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left",
                "group_right", "inf", "nan", "atan2"}


def promtool(*args, stdin=None):
    r = subprocess.run(["promtool", *args], input=stdin, capture_output=True, text=True, timeout=60)
    return r.returncode, (r.stdout + r.stderr).strip()


def grafana_subst(expr):
    for k, v in GRAFANA_VARS.items():
        expr = expr.replace(k, v)
    return expr


def metric_names(expr):
    """The metric names a PromQL expression selects: what is left once
    strings, label matchers, ranges, grouping label lists, function calls,
    keywords and numbers are taken out."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', grafana_subst(expr))
    s = re.sub(r"\{[^}]*\}", " ", s)
    s = re.sub(r"\[[^\]]*\]", " ", s)
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    names = set()
    for m in re.finditer(r"(?<![\w.])[A-Za-z_:][\w:]*", s):
        if m.group(0).lower() in PROMQL_WORDS or s[m.end():].lstrip().startswith("("):
            continue
        names.add(m.group(0))
    return names


def dashboard_exprs(dash):
    """[(where, expr)] of every target of every panel (rows' nested ones too)."""
    out = []

    def walk(panels):
        for p in panels:
            for t in p.get("targets", []):
                out.append((f"panel {p.get('id')} '{p.get('title')}' {t.get('refId')}", t.get("expr", "")))
            walk(p.get("panels", []))
    walk(dash.get("panels", []))
    return out


def all_panels(dash):
    out = []
    for p in dash.get("panels", []):
        out.append(p)
        out.extend(p.get("panels", []))
    return out


def exposition(text):
    """({sample name: [label dicts]}, {name: type}) of a text exposition."""
    samples, types = {}, {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, typ = line.split(" ", 3)
            types[name] = typ
        elif line and not line.startswith("#"):
            m = re.match(r"([A-Za-z_:][\w:]*)(\{(.*)\})?\s+(\S+)$", line)
            if not m:
                samples.setdefault("(unparsed)", []).append({"line": line})
                continue
            labels = dict(re.findall(r'([A-Za-z_]\w*)="((?:[^"\\]|\\.)*)"', m.group(3) or ""))
            labels["__value__"] = m.group(4)
            samples.setdefault(m.group(1), []).append(labels)
    return samples, types


def value(samples, metric, **labels):
    for s in samples.get(metric, []):
        if all(s.get(k) == v for k, v in labels.items()):
            return float(s["__value__"])
    return None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_prometheus(tmp, cf):
    """(Popen, base URL) of a Prometheus on a free loopback port, ready;
    a port taken meanwhile (another test) gets another try."""
    log = os.path.join(tmp, "prometheus.log")
    for _ in range(3):
        port = free_port()
        p = d._track(subprocess.Popen(["prometheus", "--config.file", cf, "--storage.tsdb.path",
                                       os.path.join(tmp, "tsdb"), "--web.listen-address", f"127.0.0.1:{port}",
                                       "--log.level", "warn"], stdout=open(log, "w"), stderr=subprocess.STDOUT))
        base = f"http://127.0.0.1:{port}"
        d.wait_for(lambda: p.poll() is not None or d.http(base, "/-/ready", timeout=2)[0] == 200, 30, 0.1)
        if p.poll() is None or "address already in use" not in open(log).read():
            return p, base
    return p, base


def prom_get(base, path, **q):
    st, r = d.http(base, path + ("?" + urllib.parse.urlencode(q) if q else ""), timeout=10)
    return r.get("data") if st == 200 and isinstance(r, dict) and r.get("status") == "success" else None


def prom_query(base, q):
    """The instant vector of query q: [{"metric", "value"}], or None."""
    r = prom_get(base, "/api/v1/query", query=q)
    return r.get("result") if isinstance(r, dict) else None


def static_checks(tmp):
    rc, out = promtool("check", "rules", os.path.join(PROM, "alerts.yml"))
    check("promtool check rules alerts.yml", rc == 0, out)
    rc, out = promtool("test", "rules", os.path.join(PROM, "alerts_test.yml"))
    check("promtool test rules alerts_test.yml", rc == 0, out)
    rules = [r for g in yaml.safe_load(open(os.path.join(PROM, "alerts.yml")))["groups"] for r in g["rules"]]
    alerts = {r["alert"] for r in rules if "alert" in r}
    tests = yaml.safe_load(open(os.path.join(PROM, "alerts_test.yml")))["tests"]
    fired, silent = set(), set()
    for t in tests:
        for a in t.get("alert_rule_test", []):
            (fired if a.get("exp_alerts") else silent).add(a["alertname"])
    check("alerts_test.yml: every alert has a case where it fires", alerts <= fired, sorted(alerts - fired))
    check("alerts_test.yml: ... and one where it does not", alerts <= silent, sorted(alerts - silent))
    check("alerts_test.yml tests only alerts that exist", fired | silent <= alerts, sorted((fired | silent) - alerts))
    for r in rules:
        ok = {"severity", } <= set(r.get("labels", {})) and {"summary", "description"} <= set(r.get("annotations", {}))
        check(f"{r.get('alert')}: a severity, a summary and a description", ok, r)

    dash = json.load(open(DASH))
    var = [v for v in dash.get("templating", {}).get("list", []) if v.get("type") == "datasource"]
    check("dashboard: a datasource variable over Prometheus", len(var) == 1 and var[0].get("query") == "prometheus", var)
    ref = "${%s}" % var[0]["name"] if var else None
    panels = [p for p in all_panels(dash) if p.get("type") != "row"]
    bad = [p.get("title") for p in panels
           if (p.get("datasource") or {}).get("uid") != ref or
           any((t.get("datasource") or {}).get("uid") != ref for t in p.get("targets", []))]
    check("dashboard: every panel and target reads the datasource variable", panels and not bad, bad)
    ids = [p.get("id") for p in all_panels(dash)]
    check("dashboard: panel ids unique", len(ids) == len(set(ids)), ids)
    cells = {}
    overlap = []
    for p in all_panels(dash):
        g = p["gridPos"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                if (x, y) in cells:
                    overlap.append((cells[(x, y)], p["title"]))
                cells[(x, y)] = p["title"]
    check("dashboard: panels inside 24 columns and not overlapping",
          not overlap and all(x < 24 for x, _ in cells), sorted(set(overlap))[:5])
    exprs = dashboard_exprs(dash)
    check("dashboard: every target has an expression", exprs and all(e for _, e in exprs), exprs)
    # PromQL syntax: promtool parses them as recording rules
    rec = {"groups": [{"name": "dashboard", "rules": [{"record": f"pipewright_dashboard:expr_{i}",
                                                       "expr": grafana_subst(e)} for i, (_, e) in enumerate(exprs)]}]}
    f = os.path.join(tmp, "dashboard_exprs.yml")
    yaml.safe_dump(rec, open(f, "w"))
    rc, out = promtool("check", "rules", f)
    check(f"dashboard: all {len(exprs)} expressions parse as PromQL (promtool)", rc == 0, out)
    return dash, exprs, rules


def job_spec(name, steps=100000, pp=1, layer_times=None, **train):
    sp = {"name": name,
          "model": {"template": "gpt", "vocab_size": 256, "seq_len": 8, "d_model": 16, "n_layers": 2, "n_heads": 2},
          "mesh": {"pp": pp}, "schedule": {"name": "1f1b", "microbatches": 2},
          "train": {"steps": steps, "batch_size": 4, **train},
          "data": {"kind": "text", "path": os.path.join(SRC, "examples/data/corpus.txt")}}
    if layer_times is not None:
        sp["partition"] = {"mode": "balanced", "layer_times": [layer_times] * 4}  # embed, 2 blocks, head
    return sp


def cli_predicted(tmp, sp):
    f = os.path.join(tmp, sp["name"] + ".json")
    json.dump(sp, open(f, "w"))
    r = subprocess.run([os.path.join(BUILD, "pipewright"), "plan", "--job", f, "--json"], capture_output=True,
                       text=True)
    try:
        return json.loads(r.stdout)["predicted_step"]["seconds"]
    except (ValueError, KeyError):
        return r.stdout + r.stderr


def main():
    tmp = tempfile.mkdtemp(prefix="pw-prom-")
    dash, exprs, rules = static_checks(tmp)
    c = d.Cluster(BUILD, tmp, "pm", data_root=SRC)
    token = os.path.join(tmp, "api.token")
    with open(token, "w") as f:
        f.write("ab" * 32 + "\n")
    os.chmod(token, 0o600)
    auth = d.Cluster(BUILD, tmp, "auth", args=("--token-file", token))  # no workers: only scraped
    prom = None
    try:
        for i in range(5):
            c.start_worker(f"w{i}")
        check("5 workers idle", c.wait_idle(5))
        specs = {"flops": job_spec("flops", pp=2), "fast-plan": job_spec("fast-plan", layer_times=1e-8),
                 "slow-plan": job_spec("slow-plan", layer_times=100.0)}
        ids = {k: c.submit(sp) for k, sp in specs.items()}
        check("the three long jobs record steps",
              d.wait_for(lambda: all(c.step(j) >= 2 for j in ids.values()), 60), {k: c.job(j) for k, j in ids.items()})

        # a real Prometheus, from the example configuration
        cfg = yaml.safe_load(open(os.path.join(PROM, "prometheus.yml")))
        cfg["global"].update(scrape_interval="1s", evaluation_interval="1s")
        cfg["rule_files"] = [os.path.join(PROM, r) for r in cfg["rule_files"]]
        (job,) = [s for s in cfg["scrape_configs"] if s["job_name"] == "pipewright"]
        job["authorization"]["credentials_file"] = token
        job["static_configs"] = [{"targets": [f"127.0.0.1:{c.http_port}", f"127.0.0.1:{auth.http_port}"]}]
        cf = os.path.join(tmp, "prometheus.yml")
        yaml.safe_dump(cfg, open(cf, "w"))
        rc, out = promtool("check", "config", cf)
        check("promtool check config: prometheus.yml (target and token file replaced)", rc == 0, out)
        prom, pbase = start_prometheus(tmp, cf)
        up = lambda: prom_query(pbase, 'up{job="pipewright"} == 1') or []  # noqa: E731
        check("Prometheus scrapes both coordinators (one of them with the API token)",
              d.wait_for(lambda: len(up()) == 2, 30, 0.2), (up(), open(os.path.join(tmp, "prometheus.log")).read()[-800:]))
        planned = lambda: prom_query(pbase, "pipewright_job_planned_step_seconds") or []  # noqa
        check("Prometheus holds the three jobs' planned steps", d.wait_for(lambda: len(planned()) == 3, 20, 0.2),
              planned())

        # two that diverge on the fifth worker: under "fail", then "skip"
        div = job_spec("diverge", steps=8, grad_clip=0, optimizer={"name": "sgd", "lr": 1e30})
        j1 = c.submit(div)
        r1 = c.wait_job(j1, 120)
        check("a job under on_nonfinite fail diverges", r1.get("state") == "failed" and "diverged" in (r1.get("error") or ""), r1)
        j2 = c.submit(dict(div, train=dict(div["train"], on_nonfinite="skip")))
        r2 = c.wait_job(j2, 120)
        check("a job under on_nonfinite skip goes on to the end", r2.get("state") == "succeeded", r2)

        st, text = d.http(c.base, "/metrics")
        check("GET /metrics", st == 200 and isinstance(text, str), (st, str(text)[:300]))
        text = text if isinstance(text, str) else ""
        open(os.path.join(tmp, "metrics.txt"), "w").write(text)
        rc, out = promtool("check", "metrics", stdin=text)
        check("promtool check metrics: the live /metrics, nothing flagged", rc == 0 and out == "", out)
        samples, types = exposition(text)
        check("every sample line parses", "(unparsed)" not in samples, samples.get("(unparsed)"))
        clash = sorted({(n, k) for n, ss in samples.items() for s in ss for k in s
                        if k in ("job", "instance") or k.startswith("exported_")})
        check("no series carries a label Prometheus sets itself (job, instance)", not clash, clash)
        check("the new metrics' types",
              types.get("pipewright_job_planned_step_seconds") == "gauge" and
              types.get("pipewright_steps_nonfinite_total") == "counter", types)
        for k, sp in specs.items():
            got = value(samples, "pipewright_job_planned_step_seconds", job_id=str(ids[k]), name=k)
            want = cli_predicted(tmp, sp)
            ok = isinstance(want, float) and got is not None and abs(got - want) <= 1e-12 * max(1.0, want)
            check(f"{k}: pipewright_job_planned_step_seconds is `pipewright plan`'s predicted step", ok, (got, want))
            cm = [s.get("cost_model") for s in samples.get("pipewright_job_planned_step_seconds", [])
                  if s.get("job_id") == str(ids[k])]
            check(f"{k}: ... costed by {'layer_times' if 'plan' in k else 'flops'}",
                  cm == ["layer_times" if "plan" in k else "flops"], cm)
            check(f"{k}: its step time is beside it, same job_id and name",
                  value(samples, "pipewright_job_step_seconds", job_id=str(ids[k]), name=k) is not None,
                  samples.get("pipewright_job_step_seconds"))
        check("no planned step for a job that is not running",
              all(s.get("job_id") in {str(j) for j in ids.values()}
                  for s in samples.get("pipewright_job_planned_step_seconds", [])),
              samples.get("pipewright_job_planned_step_seconds"))
        nf = (value(samples, "pipewright_steps_nonfinite_total", on_nonfinite="fail"),
              value(samples, "pipewright_steps_nonfinite_total", on_nonfinite="skip"))
        check("pipewright_steps_nonfinite_total: 1 failed step, 7 skipped", nf == (1.0, 7.0), nf)

        # names: what the dashboard and the rules select is exported, and the reverse
        exported = set(samples) | set(types)
        check("the name check catches a metric that is not exported",
              metric_names('sum by (le) (rate(pipewright_nope_bucket{state="x"}[5m])) / on(job_id) '
                           'group_left pipewright_jobs offset 5m > 1e3') == {"pipewright_nope_bucket", "pipewright_jobs"},
              metric_names('sum by (le) (rate(pipewright_nope_bucket{state="x"}[5m])) / on(job_id) '
                           'group_left pipewright_jobs offset 5m > 1e3'))
        missing = sorted({(w, n) for w, e in exprs for n in metric_names(e) if n not in exported})
        check("every metric the dashboard names is exported", not missing, missing)
        var = {v["name"]: re.findall(r"label_values\((\w+)", v.get("query") or "")
               for v in dash["templating"]["list"] if v.get("type") == "query"}
        check("... and its variables' queries too", all(n and set(n) <= exported for n in var.values()), var)
        missing = sorted({(r["alert"], n) for r in rules for n in metric_names(r["expr"])
                          if n not in exported and n != "up"})
        check("every metric the alert rules name is exported (or is Prometheus's up)", not missing, missing)
        shown = {n for _, e in exprs for n in metric_names(e)}
        bases = {n for n in types} | {n for n in samples if not re.search(r"_(bucket|sum|count)$", n)}
        unshown = sorted(n for n in bases if n not in shown and not any(s.startswith(n + "_") for s in shown))
        check("every exported metric is on the dashboard", not unshown, unshown)

        # Prometheus's own view: labels, rule health, the alerts that are active
        series = prom_query(pbase, '{__name__=~"pipewright_.+", exported_job!=""}')
        check("Prometheus: no series renamed to exported_job", series == [], series)
        # the diverging jobs' planned steps were scraped while they ran: their
        # series go stale at the first scrape after they end (1 s), so wait for it
        want_ids = sorted(str(j) for j in ids.values())
        d.wait_for(lambda: sorted(s["metric"].get("job_id") for s in planned()) == want_ids, 20, 0.2)
        got = {s["metric"].get("job_id"): s["metric"] for s in planned()}
        check("Prometheus: the planned steps keep job_id and name beside job and instance",
              sorted(got) == sorted(str(j) for j in ids.values()) and
              all(m.get("job") == "pipewright" and m.get("instance") and m.get("name") for m in got.values()), got)

        def rules_state():
            g = prom_get(pbase, "/api/v1/rules") or {}
            return [r for grp in g.get("groups", []) for r in grp.get("rules", [])]

        def active():
            return sorted((a["labels"]["alertname"], a["state"], a["labels"].get("job_id") or a["labels"].get("on_nonfinite"))
                          for a in (prom_get(pbase, "/api/v1/alerts") or {}).get("alerts", []))

        want = sorted([("PipewrightJobDiverged", "firing", "fail"), ("PipewrightStepsNotFinite", "firing", "skip"),
                       ("PipewrightJobSlowerThanPlan", "pending", str(ids["fast-plan"]))])
        ok = d.wait_for(lambda: active() == want, 30, 0.5)
        check("Prometheus: exactly these alerts are active: diverged and skipped steps firing, the job "
              "slower than its layer_times plan pending (its 10 minutes)", ok, (active(), want))
        rs = rules_state()
        check("Prometheus: all 7 rules loaded and evaluated without error",
              len(rs) == len(rules) == 7 and all(r.get("health") == "ok" and not r.get("lastError") for r in rs),
              [(r.get("name"), r.get("health"), r.get("lastError")) for r in rs])
        for j in ids.values():
            d.http(c.base, f"/v1/jobs/{j}", "DELETE")
    finally:
        if prom and prom.poll() is None:
            prom.send_signal(signal.SIGTERM)
            try:
                prom.wait(20)
            except subprocess.TimeoutExpired:
                prom.kill()
        rc = auth.stop()
        check("the token coordinator exits 0 on SIGTERM", all(v == 0 for v in rc.values()), rc)
        d.close_cluster(c, tmp, check, lambda: check.failed > 0)
    print(f"{check.passed} passed, {check.failed} failed")
    return 1 if check.failed else 0


if __name__ == "__main__":
    t0 = time.time()
    rc = main()
    print(f"({time.time() - t0:.1f} s)")
    sys.exit(rc)

"""test_dashboard: the web dashboard in a real browser, end to end.

Starts a real pipewright-coordinator (ephemeral ports, --ready-file, a
temporary state dir, --web pointing at web/, and an API token so the page's
token prompt is exercised) and two real pipewright-workers, submits a small
pp=2 GPT job over HTTP whose name holds a <script> tag, then drives Debian's
chromium (headless, through Playwright from PyPI) over the overview, job,
plan and generate pages and checks what a user would see:
  - the job appears in the overview and reaches `succeeded`;
  - the loss chart plots one point per training step;
  - the loss, lr, gradient norm, tokens/s and step time charts plot every
    metrics row; smoothing (TensorBoard's debiased EMA) changes the plotted
    value as computed here, the log toggle sets the scale, hover shows the
    step's value, and both settings survive a reload;
  - a diverged job's null step is a gap, not 0; another job overlaid adds a
    series named "job N name" (as text), carried by the URL's hash;
  - the overview says why a job waits ("waiting for 4 idle workers") and why
    one failed (its error);
  - the timeline of a chosen step has one lane per pipeline rank and one F
    block per (microbatch, stage), measured and planned alike;
  - the job name renders as text (no script element, no alert dialog);
  - the plan page compares the schedules and draws the chosen one, exports,
    checks and refuses custom schedules, and draws a regions model's region
    graph with its timeline lanes by region; its first example comes with
    the page even when the job list is held back;
  - the generate page, on a serve job of the first job's weights, streams
    the API's tokens, shows the request's latency, and the prompt (markup)
    as text;
  - with two more workers, a pp=4 job's 4 one-thread ranks share this
    machine's cores: the job page shows the contention note (as text, with
    its explanation) and the timeline a third, shared-cores bubble;
  - a pp 2 x tp 2 job: the job list and overview show its tp, the overview's
    workers their coordinates, the job page a grid of which worker holds
    each (pipeline rank, replica, tp rank), the partition a stage's tp
    group, why snapshots are off, and the measured timeline its lanes by
    coordinate in two tp groups with their all-reduce strips; the plan page
    at pp 2 x dp 2 x tp 2 gives each rank's dp and tp bytes per step and a
    DP block at its step's end.
Every wait on a job follows the job (cluster.job_until): a slow, sanitized
build waits longer, never past a fixed budget. The steps run in order and
share the cluster; a failed step is reported and the next ones still run.
Screenshots and the daemons' logs go to PW_DASHBOARD_OUT. Run through
tests/browser/run.sh."""
import asyncio
import codecs
import json
import math
import os
import re
import secrets
import struct
import sys
import time
import traceback
from decimal import ROUND_HALF_UP, Decimal

from playwright.async_api import async_playwright

from cluster import Cluster, launch

BUILD, SOURCE, OUT = (os.environ.get(k) for k in ("PW_BUILD_DIR", "PW_SOURCE_DIR", "PW_DASHBOARD_OUT"))
CHROMIUM = os.environ.get("PW_CHROMIUM", "/usr/bin/chromium")
if not (BUILD and SOURCE and OUT):
    sys.exit("run through tests/browser/run.sh (PW_BUILD_DIR, PW_SOURCE_DIR, PW_DASHBOARD_OUT)")
SLOW = 3 if os.environ.get("PW_SANITIZE") == "ON" else 1  # ASan builds run slower

# <script> never runs from innerHTML, but the <img onerror> would: both must show as text.
NAME = 'dash <script>alert(1)</script><img src=x onerror=alert(2)> & "quotes"'
NAME2 = "div <b>x</b><img src=x onerror=alert(3)>"
PP, MICROBATCHES, STEPS = 2, 4, 20
SPEC = {
    "name": NAME,
    "model": {"template": "gpt", "vocab_size": 256, "seq_len": 16, "d_model": 32, "n_layers": 2, "n_heads": 2},
    "mesh": {"pp": PP, "dp": 1, "virtual_stages": 1},
    "schedule": {"name": "1f1b", "microbatches": MICROBATCHES},
    "partition": {"mode": "even"},
    "train": {"steps": STEPS, "batch_size": 8, "seed": 1, "checkpoint_every": 10},
    "data": {"kind": "text", "path": "examples/data/corpus.txt", "sampler": "sequential"},
}
CHARTS = {"chart-loss": "loss", "chart-lr": "lr", "chart-grad-norm": "grad_norm",
          "chart-throughput": "tokens_per_s", "chart-step-time": "step_time"}


def spec(**over):
    """SPEC with top-level keys replaced (a deep copy)."""
    s = json.loads(json.dumps(SPEC))
    s.update(json.loads(json.dumps(over)))
    return s


def to_fixed(x, digits):
    """JavaScript's Number.prototype.toFixed (ties away from zero, on the exact double)."""
    q = Decimal(1).scaleb(-digits)
    return str(Decimal(x).quantize(q, rounding=ROUND_HALF_UP))


def fmt3(x):
    """The legend's numbers below 1000: String(Number(x.toPrecision(3)))."""
    s = repr(float(f"{x:.3g}"))
    return s[:-2] if s.endswith(".0") else s


def kib(x):
    return to_fixed(x / 1024, 1) + " KiB" if x >= 1024 else to_fixed(x, 0) + " B"


def fmt_bytes(x):
    i, units = 0, ["B", "KiB", "MiB"]
    while x >= 1024 and i < 2:
        x /= 1024
        i += 1
    return (to_fixed(x, 1) if i else to_fixed(x, 0)) + " " + units[i]


def ema(ys, w):
    """TensorBoard's debiased EMA, nulls skipped."""
    last, n, out = 0.0, 0, []
    for y in ys:
        if y is None:
            out.append(None)
            continue
        last = last * w + (1 - w) * y
        n += 1
        out.append(last / (1 - math.pow(w, n)))
    return out


def close(a, b, what):
    assert abs(a - b) <= 1e-9 * max(1, abs(b)), f"{what}: {a} vs {b}"


def eq(a, b, what=""):
    assert a == b, f"{what}: {a!r} != {b!r}" if what else f"{a!r} != {b!r}"


def match(pattern, s, what=""):
    assert s is not None and re.search(pattern, s), f"{what}: {s!r} does not match /{pattern}/"


class Dashboard:
    """The steps share one cluster, one browser page and what earlier steps made (jobs' ids)."""

    def __init__(self, c, page):
        self.c, self.page = c, page
        self.dialogs, self.page_errors, self.console_errors = [], [], []
        page.on("dialog", self.on_dialog)
        page.on("pageerror", lambda e: self.page_errors.append(str(e)))
        page.on("console", lambda m: self.console_errors.append(m.text) if m.type == "error" else None)

    async def on_dialog(self, d):
        self.dialogs.append({"type": d.type, "message": d.message})
        try:
            await d.dismiss()
        except Exception:  # noqa: BLE001 — the page may be gone
            pass

    async def shot(self, name):
        await self.page.wait_for_timeout(300)  # let the charts settle after the last data
        await self.page.screenshot(path=os.path.join(OUT, f"{name}.png"), full_page=True)

    async def attr(self, sel, a):
        return await self.page.get_attribute(sel, a)

    async def text(self, sel):
        return await self.page.text_content(sel)

    async def set_smoothing(self, chart, w):
        await self.page.eval_on_selector(f"#{chart} .chart-smooth", """(el, v) => {
            el.value = String(v);
            el.dispatchEvent(new Event('input', {bubbles: true}));
        }""", w)

    # ---- the steps, in order -------------------------------------------------
    async def token_prompt(self):
        """the page asks for the API token and then loads"""
        p = self.page
        await p.goto(self.c.base + "/#/")
        await p.wait_for_selector("#token-dialog[open]")
        await p.fill("#token-input", self.c.token)
        await p.click("#token-ok")
        await p.wait_for_selector('#workers-table tr[data-worker="dash-w0"]')
        eq(await p.evaluate("() => sessionStorage.getItem('pipewright.token')"), self.c.token)
        eq(await p.locator("#workers-table tr[data-worker]").count(), 2, "one row per worker")

    async def workers_kernel(self):
        """the workers table shows each OpenBLAS kernel, its sgemm rate and any warning"""
        w = next(x for x in (await self.c.api("/v1/workers"))["json"]["workers"] if x["name"] == "dash-w0")
        row = self.page.locator('#workers-table tr[data-worker="dash-w0"]')
        kernel = await row.locator(".worker-kernel").text_content()
        assert w["blas_core"] and kernel.startswith(w["blas_core"] + (" (forced)" if w.get("blas_forced") else "")), kernel
        match(r"^[0-9,]+ GF/s$", await row.locator(".worker-gemm").text_content())
        # the coordinator's sentences, as text (none when the kernel is OpenBLAS's own pick)
        eq(await row.locator(".worker-warning").all_text_contents(), w.get("warnings") or [])

    async def job_succeeds(self):
        """the job appears in the overview and reaches succeeded"""
        p, jid = self.page, self.id
        row = p.locator(f'#jobs-table tr[data-job="{jid}"]')
        await row.wait_for()
        await self.c.job_in(jid, "succeeded")
        # the overview refreshes on its own: no reload here
        await p.wait_for_selector(f'#jobs-table tr[data-job="{jid}"][data-state="succeeded"]')
        eq(await row.locator(".job-name").text_content(), NAME, "the name shows as typed")
        eq(await row.locator(".progress .label").text_content(), f"{STEPS}/{STEPS}")
        await self.shot("overview")

    async def job_page(self):
        """the job page: loss curve with one point per step"""
        p, jid = self.page, self.id
        await p.click(f'#jobs-table tr[data-job="{jid}"] .job-name')
        await p.wait_for_selector('#job-state [data-state="succeeded"]')
        metrics = (await self.c.api(f"/v1/jobs/{jid}/metrics"))["json"]["metrics"]
        eq(len(metrics), STEPS, "the API holds a metric row per step")
        await p.wait_for_selector(f'#chart-loss[data-points="{STEPS}"]')
        await p.wait_for_selector(f'#chart-throughput[data-points="{STEPS}"]')
        assert await p.locator("#chart-loss canvas").count() > 0, "uPlot drew a canvas"
        eq(await self.text("#job-name"), NAME)
        assert await p.locator("#job-cancel").is_hidden(), "no cancel button on a finished job"
        eq(await p.locator("#partition-table tbody tr[data-stage]").count(), PP, "a partition row per stage")
        # the attempts: one run, succeeded, on both workers (by rank), no restart
        attempts = p.locator("#attempts-table tbody tr[data-attempt]")
        eq(await attempts.count(), 1, "one attempt row per run")
        eq(await attempts.first.get_attribute("data-state"), "succeeded")
        workers = sorted((await attempts.first.locator(".attempt-workers").text_content()).split(", "))
        eq(workers, ["dash-w0", "dash-w1"], "the attempt names its workers")
        eq(await self.text("#job-restarts"), "0 of 3")
        assert await p.locator("#job-retry").is_hidden(), "no retry button on a succeeded job"

    async def checkpoint_download(self):
        """the checkpoint downloads through the page (with the token)"""
        async with self.page.expect_download() as info:
            await self.page.click("#job-checkpoint")
        dl = await info.value
        match(r"\.safetensors$", dl.suggested_filename)
        with open(await dl.path(), "rb") as f:
            buf = f.read()
        n = struct.unpack("<Q", buf[:8])[0]
        header = json.loads(buf[8:8 + n])
        assert "embed.tok.weight" in header and "lm_head.weight" in header, "the whole model in one safetensors file"

    async def timeline(self):
        """the timeline of a chosen step: a lane per rank, an F per microbatch and stage"""
        p, jid = self.page, self.id
        await p.wait_for_selector("#tl-measured [data-lane]")
        steps = await p.eval_on_selector_all("#timeline-step option",
                                             "os => os.map((o) => o.value).filter((v) => v !== '')")
        assert len(steps) >= 1, "at least one sampled step"
        # choose the step that ran closest to plan (the least measured bubble), among
        # those every rank traced (a rank whose trace buffers were all busy, on a
        # loaded machine, leaves that step untraced: one lane)
        chosen, best = steps[0], math.inf
        for st in steps:
            tl = (await self.c.api(f"/v1/jobs/{jid}/timeline?step={st}"))["json"]
            if len(tl.get("ranks") or []) != PP:
                continue
            b = tl["bubble"]["measured"]
            if isinstance(b, (int, float)) and b < best:
                best, chosen = b, st
        await p.select_option("#timeline-step", chosen)
        await p.wait_for_function("(s) => document.getElementById('tl-measured-title').textContent"
                                  ".includes(`step ${s} `)", arg=chosen)
        S = PP  # 1f1b: one stage per rank
        eq(await p.locator("#tl-measured [data-lane]").count(), PP, "measured: one lane per rank")
        eq(await p.locator('#tl-measured [data-kind="F"]').count(), MICROBATCHES * S,
           "measured: microbatches x stages F blocks")
        eq(await p.locator('#tl-measured [data-kind="B"]').count(), MICROBATCHES * S, "measured: as many B blocks")
        for s in range(S):
            eq(await p.locator(f'#tl-measured [data-lane="{s}"] [data-kind="F"][data-stage="{s}"]').count(),
               MICROBATCHES, f"rank {s} runs the F of stage {s} for every microbatch")
        eq(await p.locator("#tl-planned [data-lane]").count(), PP, "planned: one lane per rank")
        eq(await p.locator('#tl-planned [data-kind="F"]').count(), MICROBATCHES * S)
        match(r"^\d+(\.\d)?%$", await self.text("#timeline-bubble-measured .bubble-value"),
              "the measured bubble ratio is shown")
        match(r"^\d+(\.\d)?%$", await self.text("#timeline-bubble-planned .bubble-value"))
        eq(await self.attr("#timeline-trace", "href"), f"/v1/jobs/{jid}/timeline?step={chosen}&format=chrome")
        await self.shot("job")

    async def plan_page(self):
        """the plan page compares schedules and draws the chosen one"""
        p, c = self.page, self.c
        await p.goto(f"{c.base}/#/plan?job={self.id}")
        await p.wait_for_selector('#plan-compare-table tr[data-schedule="1f1b"]')
        rows = await p.locator("#plan-compare-table tbody tr[data-schedule]").count()
        cmp = await c.api("/v1/plans?compare=1", "POST", SPEC)
        eq(rows, len(cmp["json"]["rows"]), "a row per schedule the API compares")
        await p.wait_for_selector('#plan-detail [data-schedule="1f1b"]')
        await p.click('#plan-compare-table tr[data-schedule="zb-h1"] button')
        await p.wait_for_selector('#plan-detail [data-schedule="zb-h1"]')
        eq(await p.locator("#plan-timeline [data-lane]").count(), PP)
        eq(await p.locator('#plan-timeline [data-kind="W"]').count(), MICROBATCHES * PP,
           "zb-h1 splits every backward: a W per microbatch and stage")
        # each rank's in-memory snapshot bytes per step (snapshot_every defaults to 1), as the API plans them
        zb = (await c.api("/v1/plans?schedule=zb-h1", "POST", SPEC))["json"]
        for k, r in enumerate(zb["analytics"]["ranks"]):
            assert r["snapshot_bytes_per_step"] > 0, f"rank {k}: the plan has snapshot bytes"
            got = await self.text(f"#plan-ranks tbody tr:nth-child({k + 1}) .plan-snap")
            assert got.startswith(f"snap {kib(r['snapshot_bytes_per_step'])} \u00b7 "), f"rank {k} snap: {got}"
        await self.shot("plan")

    async def plan_custom(self):
        """the plan page exports, checks and refuses custom schedules"""
        # Export the shown plan (zb-h1), check it as it is (the simulator proves it: "ok" with
        # the same bubble), then with one action deleted (the verdict names it).
        p, c = self.page, self.c
        want = (await c.api("/v1/plans?schedule=zb-h1", "POST",
                            spec(schedule={"name": "zb-h1", "microbatches": MICROBATCHES})))["json"]
        # the model-free bubble beside the model's (GET /v1/schedules/zb-h1/analytics)
        await p.wait_for_function("() => /^without the model \\(unit costs\\): bubble [0-9.]+%/"
                                  ".test(document.getElementById('plan-unit-bubble').textContent)")
        async with p.expect_download() as info:
            await p.click("#plan-custom-export")
        dl = await info.value
        eq(dl.suggested_filename, "zb-h1-custom.json")
        with open(await dl.path(), encoding="utf-8") as f:
            exported = json.load(f)
        eq(exported, {"ranks": want["plan"]["ranks"]}, "the download is the plan's ranks as schedule.custom")
        eq(await p.input_value("#plan-custom"), "\n".join(want["plan"]["ranks"]), "and fills the editor")

        # pasted back as a user would, then checked
        await p.fill("#plan-custom", "")
        await p.fill("#plan-custom", "\n".join(exported["ranks"]) + "\n")
        await p.click("#plan-custom-check")
        await p.wait_for_selector("#plan-custom-verdict[data-verdict]")
        ok = await self.text("#plan-custom-verdict")
        eq(await self.attr("#plan-custom-verdict", "data-verdict"), "ok", f"verdict: {ok}")
        assert f"bubble {to_fixed(100 * want['analytics']['bubble_ratio'], 1)}%" in ok, ok
        await p.wait_for_selector('#plan-detail [data-schedule="custom"]')
        eq(await p.locator('#plan-timeline [data-kind="W"]').count(), MICROBATCHES * PP,
           "the checked plan is drawn: zb-h1's W blocks")

        # one action deleted: rank 0's last (a W of zb-h1)
        rows = [r.split(" ") for r in exported["ranks"]]
        gone = rows[0].pop()
        match(r"^W\d+@s0$", gone)
        await p.fill("#plan-custom", "\n".join(" ".join(r) for r in rows))
        await p.click("#plan-custom-check")
        await p.wait_for_selector('#plan-custom-verdict[data-verdict="error"]')
        bad = await self.text("#plan-custom-verdict")
        assert bad.startswith("error: ") and gone in bad, f"the error names {gone}: {bad}"
        await self.shot("plan-custom")

    async def plan_regions(self):
        """the plan page draws a regions model: the region graph and lanes by region"""
        # examples/jobs/two-tower.json: one row, its regions' own schedules; the region
        # graph; planned lanes labelled by region.
        p = self.page
        with open(os.path.join(SOURCE, "examples/jobs/two-tower.json"), encoding="utf-8") as f:
            tt = json.load(f)
        await p.fill("#plan-spec", json.dumps(tt, indent=2))
        await p.click("#plan-compare")
        await p.wait_for_selector('#plan-detail [data-schedule="regions"]')
        eq(await p.locator("#plan-compare-table tbody tr[data-schedule]").count(), 1)
        eq(await p.locator("#plan-regions .region-box").evaluate_all("els => els.map((e) => e.dataset.region)"),
           ["text", "vision", "head"])
        match(r"text \+ vision \(concat\)", await self.text('#plan-regions .region-box[data-region="head"]'))
        match("zb-h1 · ranks 2–3", await self.text('#plan-regions .region-box[data-region="vision"]'))
        eq(await p.locator('#plan-timeline [data-region="text"]').count(), 2, "text: ranks 0 and 1")
        eq(await p.locator('#plan-timeline [data-region="head"]').count(), 1)
        match(r"^vision r2$", await self.text('#plan-timeline [data-region="vision"] .lane-label'))
        await self.shot("plan-regions")

    async def charts(self):
        """the job page charts loss, lr, gradient norm, tokens/s and step time"""
        p, c = self.page, self.c
        # the failing and the waiting job, submitted now (the plan tests are done with the workers)
        self.fid = await c.submit(spec(name=NAME2, train={"steps": 6, "batch_size": 8, "seed": 1, "grad_clip": 0,
                                                          "optimizer": {"name": "sgd", "lr": 1e30}}))
        await p.goto(f"{c.base}/#/jobs/{self.id}")
        rows = (await c.api(f"/v1/jobs/{self.id}/metrics"))["json"]["metrics"]
        for chart, key in CHARTS.items():
            await p.wait_for_selector(f'#{chart}[data-points="{len(rows)}"]')
            assert await p.locator(f"#{chart} canvas").count() > 0, f"{chart}: uPlot drew a canvas"
            eq(await self.attr(f"#{chart}", "data-series"), "1")
            w = float(await self.attr(f"#{chart}", "data-smoothing"))
            want = ema([r[key] for r in rows], w)[-1]
            close(float(await self.attr(f"#{chart}", "data-last")), want, f"{chart}'s last smoothed value at {w}")
        eq(await self.attr("#chart-lr", "data-smoothing"), "0", "lr is not smoothed by default")
        eq(await self.attr("#chart-loss", "data-smoothing"), "0.6", "loss is, at 0.6")
        eq(float(await self.attr("#chart-lr", "data-last")), rows[-1]["lr"], "unsmoothed: the last lr itself")

    async def smoothing(self):
        """smoothing, log scale and hover; the settings persist"""
        p = self.page
        loss = [r["loss"] for r in (await self.c.api(f"/v1/jobs/{self.id}/metrics"))["json"]["metrics"]]
        await self.set_smoothing("chart-loss", 0)
        await p.wait_for_selector('#chart-loss[data-smoothing="0"]')
        eq(float(await self.attr("#chart-loss", "data-last")), loss[-1], "no smoothing: the raw last loss")
        await self.set_smoothing("chart-loss", 0.9)
        await p.wait_for_selector('#chart-loss[data-smoothing="0.9"]')
        smoothed = float(await self.attr("#chart-loss", "data-last"))
        close(smoothed, ema(loss, 0.9)[-1], "smoothed at 0.9")
        assert smoothed != loss[-1], "smoothing moved the plotted value"
        eq(await self.text("#chart-loss .chart-smooth-value"), "0.90")

        eq(await self.attr("#chart-loss", "data-log"), "0")
        await p.check("#chart-loss .chart-log")
        await p.wait_for_selector('#chart-loss[data-log="1"]')
        assert not await p.locator("#chart-loss .chart-log").is_disabled(), "losses are > 0"
        eq(await self.text("#chart-loss .chart-note"), "")

        # hover: the legend follows the cursor with the step and the value there
        box = await p.locator("#chart-loss .u-over").bounding_box()
        await p.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        await p.wait_for_function("() => document.querySelector('#chart-loss .chart-legend').dataset.step !== ''")
        step = int(await self.attr("#chart-loss .chart-legend", "data-step"))
        assert 0 < step < STEPS - 1, f"mid-chart step {step}"
        eq(await self.text("#chart-loss .chart-legend-step"), f"step {step}")
        shown = await self.text(f'#chart-loss .chart-legend-item[data-job="{self.id}"] .chart-legend-value')
        assert shown.startswith(fmt3(ema(loss, 0.9)[step])), f"legend value at step {step}: {shown}"
        await p.mouse.move(0, 0)

        await p.reload()
        await p.wait_for_selector(f'#chart-loss[data-points="{len(loss)}"]')
        eq(await self.attr("#chart-loss", "data-smoothing"), "0.9", "smoothing kept in localStorage")
        eq(await self.attr("#chart-loss", "data-log"), "1", "and the log scale")
        await p.uncheck("#chart-loss .chart-log")
        await p.wait_for_selector('#chart-loss[data-log="0"]')
        await self.shot("job-curves")

        # a series with a value <= 0 cannot have a log axis: the toggle says why (a scratch chart)
        scratch = await p.evaluate("""() => {
            localStorage.setItem('pipewright.chart.scratch', JSON.stringify({smooth: 0, log: true}));
            const el = document.body.appendChild(document.createElement('div'));
            const c = PW.charts.metric(el, {key: 'scratch', title: 'scratch'});
            const seen = (ys) => {
              c.set([{job: 1, label: 'job 1', color: '#000000', xs: [0, 1, 2], ys}]);
              return {log: el.dataset.log, disabled: el.querySelector('.chart-log').disabled,
                      note: el.querySelector('.chart-note').textContent, last: el.dataset.last};
            };
            const out = [seen([1, 0, null]), seen([1, 10, null])];
            c.destroy();
            el.remove();
            return out;
        }""")
        eq(scratch[0], {"log": "0", "disabled": True, "note": "log scale needs values > 0", "last": "0"})
        eq(scratch[1], {"log": "1", "disabled": False, "note": "", "last": "10"}, "the null step is a gap, not 0")

    async def diverged(self):
        """a diverged job: its null step is a gap, not 0"""
        p, fid = self.page, self.fid
        j = await self.c.job_until(fid, "state failed", lambda j: j["state"] == "failed")
        match(r"diverged at step 1", j["error"])
        rows = (await self.c.api(f"/v1/jobs/{fid}/metrics"))["json"]["metrics"]
        assert len(rows) >= 2 and rows[1]["loss"] is None and rows[0]["loss"] > 0, json.dumps(rows)
        await p.goto(f"{self.c.base}/#/jobs/{fid}")
        await p.wait_for_selector(f'#chart-loss[data-points="{len(rows)}"]')
        # one finite point: its debiased average is itself, whatever the weight (0 would pull it down)
        close(float(await self.attr("#chart-loss", "data-last")), rows[0]["loss"], "the last plotted loss")
        close(float(await self.attr("#chart-grad-norm", "data-last")), rows[0]["grad_norm"],
              "the last plotted grad norm")

    async def overlay(self):
        """other jobs overlaid: a series each, named in the legend, carried by the URL"""
        p, c, jid, fid = self.page, self.c, self.id, self.fid
        await p.goto(f"{c.base}/#/jobs/{jid}")
        await p.wait_for_selector(f'#chart-loss[data-points="{STEPS}"]')
        eq(await self.attr("#chart-loss", "data-series"), "1")
        await p.fill("#overlay-input", f" {fid} ")
        await p.click("#overlay-apply")
        for chart in CHARTS:
            await p.wait_for_selector(f'#{chart}[data-series="2"]')
        eq(await p.evaluate("() => location.hash"), f"#/jobs/{jid}?overlay={fid}")
        label = p.locator(f'#chart-loss .chart-legend-item[data-job="{fid}"] .chart-legend-label')
        eq(await label.text_content(), f"job {fid} {NAME2}", "the legend names the job, as text")
        eq(await p.locator("#charts-card img, #charts-card b").count(), 0, "no markup made from the name")
        eq(await self.text(f'#chart-loss .chart-legend-item[data-job="{jid}"] .chart-legend-label'), f"job {jid} {NAME}")

        # shared as a link: the overlay comes back from the URL alone
        await p.goto(f"{c.base}/#/jobs/{jid}?overlay={fid}")
        await p.reload()
        await p.wait_for_selector('#chart-lr[data-series="2"]')
        eq(await p.input_value("#overlay-input"), str(fid))

        # the recent jobs' list adds one
        self.qid = qid = await c.submit(spec(name="dash-wait", mesh={"pp": 2, "dp": 2}))
        await p.focus("#overlay-pick")
        await p.wait_for_selector(f'#overlay-pick option[value="{qid}"]', state="attached")
        await p.select_option("#overlay-pick", str(qid))
        await p.wait_for_selector('#chart-loss[data-series="3"]')
        eq(await p.input_value("#overlay-input"), f"{fid}, {qid}")
        eq(await p.evaluate("() => location.hash"), f"#/jobs/{jid}?overlay={fid},{qid}")
        await self.shot("job-overlay")

    async def reasons(self):
        """the overview says why a job waits and why one failed"""
        p, c, qid, fid = self.page, self.c, self.qid, self.fid
        await p.goto(c.base + "/#/")
        await p.wait_for_function("(q) => /^waiting for 4 idle workers/.test((document.querySelector("
                                  "`#jobs-table tr[data-job=\"${q}\"] .job-reason`) || {}).textContent || '')", arg=qid)
        wait = p.locator(f'#jobs-table tr[data-job="{qid}"][data-state="queued"] .job-reason')
        match(r"^waiting for 4 idle workers \(2 idle, 0 busy connected\)$", await wait.text_content())
        err = (await c.job(fid))["error"]
        eq(await self.text(f'#jobs-table tr[data-job="{fid}"][data-state="failed"] .job-reason'), err)
        eq(await p.locator(f'#jobs-table tr[data-job="{self.id}"] .job-reason').count(), 0,
           "a succeeded job has no reason line")
        await self.shot("overview-reasons")
        await c.cancel(qid)

    async def eval_series(self):
        """train.eval_every: the loss chart has an eval series, a point per evaluated step"""
        p, c = self.page, self.c
        eid = await c.submit(spec(name="dash-eval", train={"steps": 6, "batch_size": 8, "seed": 1,
                                                           "eval_every": 3, "eval_batches": 1}))
        await c.job_in(eid, "succeeded")
        rows = (await c.api(f"/v1/jobs/{eid}/metrics"))["json"]["metrics"]
        eq([m["step"] for m in rows if m["eval_loss"] is not None], [2, 5], json.dumps(rows))
        await p.goto(f"{c.base}/#/jobs/{eid}")
        await p.wait_for_selector('#chart-loss[data-points="6"][data-eval-points="2"]')
        eq(await self.attr("#chart-loss", "data-series"), "1", "the eval series is the same job's")
        items = p.locator(f'#chart-loss .chart-legend-item[data-job="{eid}"]')
        eq(await items.count(), 2, "the legend has the training and the eval loss")
        eq(await items.nth(1).locator(".chart-legend-label").text_content(), f"job {eid} dash-eval eval")
        eq(await items.nth(1).locator(".chart-legend-value").text_content(), fmt3(rows[5]["eval_loss"]),
           "the last eval loss (step 6)")
        await self.shot("job-eval")

    async def generate(self):
        """the generate page: a serve job's tokens stream in, with their latency; the prompt is text"""
        p, c = self.page, self.c
        gid = await c.submit(spec(name="dash-serve", mode="serve", init={"job": self.id, "step": STEPS},
                                  serve={"max_sequences": 2}))
        await c.job_until(gid, "it to serve", lambda j: j["state"] == "running" and j.get("status") == "serving")
        try:
            prompt = "<b>hi</b>"  # 9 bytes and 8 new tokens: the 16 positions of seq_len
            want = (await c.api(f"/v1/jobs/{gid}/generate", "POST", {"prompt": prompt, "max_tokens": 8}))["json"]
            assert want.get("results"), json.dumps(want)
            tokens = want["results"][0]["tokens"]
            await p.goto(f"{c.base}/#/generate?job={gid}")
            await p.wait_for_selector(f'#gen-job option[value="{gid}"]', state="attached")
            eq(await p.input_value("#gen-job"), str(gid), "the job from the URL is picked")
            await p.fill("#gen-prompt", prompt)
            await p.fill("#gen-max", "8")
            await p.click("#gen-go")
            await p.wait_for_selector("#gen-history tr")
            # TextDecoder's stream mode: an unfinished UTF-8 sequence at the end waits for more bytes
            eq(await self.text("#gen-out"), codecs.getincrementaldecoder("utf-8")("replace").decode(bytes(tokens)),
               "the same tokens as the API's")
            match(r"^8 tokens; time to first token [0-9.]+ ms; ([0-9.]+|\u2014) tokens/s after it "
                  r"\(coordinator: [0-9.]+ ms, [0-9.]+ tokens/s\)$", await self.text("#gen-stats"))
            eq(await self.text("#gen-history tr td.mono"), prompt, "the prompt shows as typed")
            eq(await p.locator("#view b").count(), 0, "no markup made from the prompt or the output")
            await self.shot("generate")
        finally:
            await c.cancel(gid)

    async def as_text(self):
        """user data renders as text: no script, no alert"""
        p = self.page
        await p.goto(self.c.base + "/#/")
        await p.wait_for_selector(f'#jobs-table tr[data-job="{self.id}"]')
        eq(await p.locator("#view script").count(), 0, "no script element made from data")
        assert await p.evaluate("() => Array.from(document.scripts).every((s) => s.src.startsWith(location.origin))"), \
            "only the dashboard's own scripts"
        eq([d for d in self.dialogs if d["type"] == "alert"], [], "no alert fired")
        eq(self.page_errors, [], "no uncaught errors in the page")
        # (the browser logs every non-2xx fetch, such as the first 401, as "Failed to load resource")
        eq([m for m in self.console_errors if not m.startswith("Failed to load resource")], [], "no console errors")

    async def shared_cores(self):
        """ranks that share cores: the job page notes it, the timeline shows the shared-cores bubble"""
        p, c = self.page, self.c
        # the workers report sysconf's online CPUs as their cores
        cores = os.cpu_count()
        if cores >= 4:
            return f"skipped: {cores} cores: 4 one-thread ranks do not share them"
        await c.workers([f"dash-w{i}" for i in range(4)])
        sid = await c.submit(spec(name="dash-shared <b>x</b>", mesh={"pp": 4, "dp": 1, "virtual_stages": 1},
                                  model={**SPEC["model"], "n_layers": 4}, train={**SPEC["train"], "steps": 4}))
        j = await c.job_in(sid, "succeeded")
        assert j.get("contention"), "the job JSON carries contention"
        match(f"^4 ranks with 1 thread each share {cores} cores? on host ", j["contention"]["message"])
        tl = (await c.api(f"/v1/jobs/{sid}/timeline"))["json"]
        assert tl["bubble"]["planned_shared"] > tl["bubble"]["planned"], json.dumps(tl["bubble"])

        await p.goto(f"{c.base}/#/jobs/{sid}")
        await p.wait_for_selector("#job-contention:not([hidden])")
        eq(await self.text("#job-contention-msg"), j["contention"]["message"], "the message, as text")
        assert await p.is_hidden("#job-contention-doc")
        await p.click("#job-contention-why")
        match(r"docs/architecture\.md, section .Ranks that share cores.", await self.text("#job-contention-doc"))
        await p.wait_for_selector("#timeline-bubble-shared")
        eq(await self.text("#timeline-bubble-shared .bubble-value"), to_fixed(100 * tl["bubble"]["planned_shared"], 1) + "%")
        eq(await self.text("#timeline-bubble-planned .bubble-value"), to_fixed(100 * tl["bubble"]["planned"], 1) + "%")
        assert j["contention"]["message"] in await self.text("#timeline-shared-note")
        await self.shot("job-contention")

        # the first job (2 one-thread ranks on this host's cores): no note, two bubbles
        await p.goto(f"{c.base}/#/jobs/{self.id}")
        await p.wait_for_selector("#timeline-bubble-planned")
        assert await p.is_hidden("#job-contention"), "no contention note"
        eq(await p.locator("#timeline-bubble-shared").count(), 0, "no shared-cores bubble")
        eq(self.page_errors, [], "no uncaught errors in the page")

    async def mesh_tp(self):
        """a pp 2 x tp 2 job: the mesh grid, the workers' coordinates, tp groups in the timeline"""
        p, c = self.page, self.c
        await c.workers([f"dash-w{i}" for i in range(4)])
        tspec = spec(name="dash-tp", mesh={"pp": 2, "dp": 1, "tp": 2, "virtual_stages": 1},
                     train={**SPEC["train"], "steps": 100000, "checkpoint_every": 0})
        tid = await c.submit(tspec)
        try:
            j = await c.job_until(tid, "a sampled step on 4 ranks", lambda x: x["state"] == "running" and
                                  (x.get("progress") or {}).get("step", 0) >= 1 and len(x["ranks"]) == 4)

            def label(k):
                return f"pp{k['pipeline_rank']} dp{k['replica']} tp{k['tp_rank']}"
            eq([label(k["coordinate"]) for k in j["ranks"]],
               ["pp0 dp0 tp0", "pp0 dp0 tp1", "pp1 dp0 tp0", "pp1 dp0 tp1"], "rank = (pp rank) x tp + tp rank")
            eq(j["snapshots"]["every"], 0)
            match("tensor-parallel", j["snapshots"]["note"])

            # the job list carries tp (from the spec) and the overview's mesh column shows it
            listed = next(x for x in (await c.api("/v1/jobs"))["json"]["jobs"] if x["id"] == tid)
            eq(listed["mesh"], {"pp": 2, "dp": 1, "virtual_stages": 1, "tp": 2})
            # the workers table: each busy worker's job, rank and coordinate
            await p.goto(c.base + "/#/")
            await p.wait_for_selector(f'#jobs-table tr[data-job="{tid}"]')
            eq(await self.text(f'#jobs-table tr[data-job="{tid}"] td:nth-child(5)'), "pp 2 \u00d7 dp 1 \u00d7 tp 2")
            await p.wait_for_selector("#workers-table tr[data-worker] .worker-coord")
            for k in j["ranks"]:
                eq(await self.text(f'#workers-table tr[data-worker="{k["worker"]}"] .worker-coord'),
                   " \u00b7 " + label(k["coordinate"]), f"worker {k['worker']}")

            # the job page: a grid pp x tp per replica, each cell the worker at that coordinate
            await p.goto(f"{c.base}/#/jobs/{tid}")
            await p.wait_for_selector('#job-mesh[data-tp="2"]')
            eq(await p.locator("#job-mesh .mesh-replica").count(), 1, "one replica")
            eq(await p.locator("#job-mesh td.mesh-cell").count(), 4)
            for k in j["ranks"]:
                co = k["coordinate"]
                eq(await self.attr(f'#job-mesh td[data-coord="{co["pipeline_rank"]},{co["replica"]},{co["tp_rank"]}"]',
                                   "data-worker"), k["worker"], label(co))
            eq(await self.text("#job-snapshots"), j["snapshots"]["note"], "the note, as the API says it")
            await p.wait_for_selector('#partition-table tbody tr[data-stage="1"]')
            eq(await self.text('#partition-table tr[data-stage="1"] td:nth-child(3)'),
               ", ".join(k["worker"] for k in j["ranks"] if k["coordinate"]["pipeline_rank"] == 1),
               "a stage's workers: its tp group")
            # the measured timeline: 4 lanes labelled by coordinate, two tp groups of two; the plan: a lane per pp rank
            await p.wait_for_selector('#tl-measured[data-lanes="4"]')
            eq(await p.eval_on_selector_all("#tl-measured g.lane", "gs => gs.map((g) => g.getAttribute('data-tpgroup'))"),
               ["0", "0", "1", "1"])
            eq(await p.eval_on_selector_all("#tl-measured g.lane .lane-label", "ts => ts.map((x) => x.textContent)"),
               ["pp0 dp0 tp0", "pp0 dp0 tp1", "pp1 dp0 tp0", "pp1 dp0 tp1"])
            eq(await self.attr("#tl-planned", "data-lanes"), "2")
            # each member's tensor-parallel all-reduces: strips inside its F and B blocks, their time on the lane
            for k in range(4):
                assert await p.locator(f'#tl-measured g.lane[data-lane="{k}"] g.k-T').count() > 0, f"rank {k}: T strips"
                match("^tp [0-9.]+ (ms|\u00b5s|s)$", await self.attr(f'#tl-measured g.lane[data-lane="{k}"]', "data-coll"))
            await self.shot("job-mesh-tp")

            # the plan page at pp 2 x dp 2 x tp 2: each rank's dp and tp volume per step, and its DP block at the
            # step's end
            mspec = {**tspec, "name": "dash-mesh-plan", "mesh": {"pp": 2, "dp": 2, "tp": 2, "virtual_stages": 1},
                     "train": {**tspec["train"], "batch_size": 16}}
            plan = (await c.api("/v1/plans", "POST", mspec))["json"]
            assert plan.get("analytics") and plan["analytics"]["step_makespan"] > plan["analytics"]["makespan"], \
                json.dumps(plan)[:300]
            # the first example is in the box as soon as the box is, not after the page's first request (the
            # job list, held back here): set then, it once landed inside this fill
            async def held(route):
                await asyncio.sleep(1.5)
                try:
                    await route.continue_()
                except Exception as e:  # unrouted while it slept: Playwright sent the request on itself
                    if "already handled" not in str(e):
                        raise
            await p.route("**/v1/jobs?limit=*", held)
            await p.goto(f"{c.base}/#/plan")
            await p.wait_for_selector("#plan-spec")
            assert (await p.input_value("#plan-spec")).startswith("{"), "the first example comes with the page"
            await p.unroute("**/v1/jobs?limit=*", held)
            await p.fill("#plan-spec", json.dumps(mspec))
            await p.click("#plan-compare")
            # the page's first example may have been planned already (also 1f1b): wait for this spec's dp column,
            # or an error (said, not a timeout)
            failed = "#plan-error:not([hidden]), #plan-detail .banner.error"
            try:
                await p.wait_for_selector(f'#plan-detail [data-schedule="1f1b"] #plan-ranks .plan-dp, {failed}')
            except Exception as e:  # say what the coordinator's pool of expensive requests was doing
                m = (await c.api("/metrics", raw=True))["text"]
                raise AssertionError(f"{e}\n" + "; ".join(x for x in m.split("\n") if x.startswith("pipewright_http_pool")))
            eq(await p.locator(failed).count(), 0, "; ".join(await p.locator(failed).all_text_contents()))
            for k, r in enumerate(plan["analytics"]["ranks"]):
                eq(await p.locator(f'#plan-timeline g.lane[data-lane="{k}"] [data-kind="D"]').count(), 1,
                   f"rank {k}: a DP block")
                for what in ("dp", "tp"):
                    got = await self.text(f"#plan-ranks tbody tr:nth-child({k + 1}) .plan-{what}")
                    assert got.startswith(f"{what} {fmt_bytes(r[what + '_bytes_per_step'])} \u00b7 "), \
                        f"rank {k} {what}: {got}"
            await self.shot("plan-mesh")
        finally:
            await c.cancel(tid)
        eq(self.page_errors, [], "no uncaught errors in the page")

    STEPS = ["token_prompt", "workers_kernel", "job_succeeds", "job_page", "checkpoint_download", "timeline",
             "plan_page", "plan_custom", "plan_regions", "charts", "smoothing", "diverged", "overlay", "reasons",
             "eval_series", "generate", "as_text", "shared_cores", "mesh_tp"]


async def main():
    os.makedirs(OUT, exist_ok=True)
    c = Cluster(BUILD, SOURCE, OUT, slow=SLOW)
    failed, passed = [], 0
    try:
        coord = await c.coordinator(token=secrets.token_hex(16))
        await c.workers(["dash-w0", "dash-w1"])
        # The API really wants the token (so the page's prompt is what gets it through).
        eq((await c.api("/v1/jobs", auth=False))["status"], 401, "the API answers 401 without the token")
        jid = await c.submit(SPEC)

        async with async_playwright() as pw:
            ctx = await launch(pw, os.path.join(c.tmp, "chromium"), CHROMIUM)
            try:
                page = ctx.pages[0] if ctx.pages else await ctx.new_page()
                page.set_default_timeout(30000 * SLOW)
                d = Dashboard(c, page)
                d.id = jid
                for i, name in enumerate(Dashboard.STEPS, 1):
                    fn = getattr(d, name)
                    t0 = time.monotonic()
                    try:
                        said = await fn()
                        passed += 1
                        print(f"ok {i} - {fn.__doc__}{' # ' + said if said else ''} ({time.monotonic() - t0:.1f} s)",
                              flush=True)
                    except Exception:  # noqa: BLE001 — reported; the next steps still run
                        failed.append(name)
                        print(f"not ok {i} - {fn.__doc__} ({time.monotonic() - t0:.1f} s)", flush=True)
                        traceback.print_exc()
                        sys.stdout.flush()
            finally:
                await ctx.close()

        # Every daemon stops cleanly (a crash on any request the dashboard made would show here).
        for name in [n for n in c.procs if n != "coordinator"]:
            await c.stop(name)
        ex = await c.stop("coordinator")
        if ex != (0, "exit"):
            failed.append("coordinator exit")
            print(f"not ok - the coordinator stops cleanly: {ex}\n{c.log_tail('coordinator')}")
        del coord
    finally:
        c.kill_all()
    print(f"{passed} passed, {len(failed)} failed")
    if failed:
        print(f"failed: {', '.join(failed)}; logs and screenshots in {OUT}; scratch kept: {c.tmp}")
        return 1
    c.remove_scratch()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))

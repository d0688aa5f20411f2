"""screenshots: the dashboard pictures in docs/screenshots/, taken from a
real cluster doing real work (not the browser test's fixture, whose job name
is an XSS payload): a coordinator and four workers on loopback train the
example GPT at two learning rates side by side, a run that diverges, the
4-rank example while another job waits for workers; then chromium
photographs the overview, the job page (the first run, the second overlaid)
and the plan page (the 4-rank example's schedules compared).

  docs/screenshots.sh            (tests/browser/run.sh BUILD . screenshots.py)
Writes PW_SCREENSHOTS_DIR (default SOURCE/docs/screenshots): overview.png,
job.png, plan.png."""
import asyncio
import copy
import json
import os
import sys

from playwright.async_api import async_playwright

from cluster import Cluster, launch

BUILD, SOURCE, OUT = (os.environ.get(k) for k in ("PW_BUILD_DIR", "PW_SOURCE_DIR", "PW_DASHBOARD_OUT"))
CHROMIUM = os.environ.get("PW_CHROMIUM", "/usr/bin/chromium")
if not (BUILD and SOURCE and OUT):
    sys.exit("run through tests/browser/run.sh BUILD SOURCE screenshots.py")
DIR = os.environ.get("PW_SCREENSHOTS_DIR") or os.path.join(SOURCE, "docs", "screenshots")
SLOW = 3 if os.environ.get("PW_SANITIZE") == "ON" else 1


def example(f):
    with open(os.path.join(SOURCE, "examples", "jobs", f), encoding="utf-8") as fh:
        return json.load(fh)


def say(m):
    print(f"screenshots: {m}", flush=True)


async def main():
    os.makedirs(OUT, exist_ok=True)
    c = Cluster(BUILD, SOURCE, OUT, slow=SLOW)
    ok = False
    try:
        await c.coordinator()
        await c.workers([f"w{i}" for i in range(4)])

        # the example GPT at two learning rates, side by side on two workers each
        gpt = example("gpt-tiny.json")
        gpt["train"]["steps"] = 200
        gpt["train"]["eval_every"] = 25  # the held-out loss beside the training loss
        slow = copy.deepcopy(gpt)
        slow["name"] = "gpt-tiny lr 1e-3"
        slow["train"]["optimizer"].update(lr=1e-3, min_lr=1e-4)
        a, b = await c.submit(gpt), await c.submit(slow)
        say(f"jobs {a} and {b} training")
        await c.ended(a)
        await c.ended(b)
        # a run that diverges (its failure reason shows in the overview)
        div = copy.deepcopy(gpt)
        div["name"] = "gpt-tiny lr 30"
        div["train"]["optimizer"].update(lr=30, min_lr=3)
        div["train"]["grad_clip"] = 0
        await c.ended(await c.submit(div))
        # the 4-rank example running while a 2-rank job waits for workers; it runs
        # until cancelled after the pictures (its 20 steps take ~5 s, less than
        # chromium's start on a busy host: the overview missed it running once)
        pp4spec = example("gpt-pp4.json")
        pp4spec["train"]["steps"] = 2000
        pp4 = await c.submit(pp4spec)
        llama = example("llama-tiny.json")
        llama["train"]["steps"] = 50
        waiting = await c.submit(llama)
        await c.job_in(pp4, "running")

        async with async_playwright() as pw:
            ctx = await launch(pw, os.path.join(c.tmp, "chromium"), CHROMIUM)
            page = ctx.pages[0] if ctx.pages else await ctx.new_page()
            page.set_default_timeout(60000 * SLOW)
            os.makedirs(DIR, exist_ok=True)

            async def shot(name):
                await page.wait_for_timeout(500)  # the charts settle after their last data
                path = os.path.join(DIR, f"{name}.png")
                await page.screenshot(path=path, full_page=True)
                say(path)

            await page.goto(f"{c.base}/#/")
            await page.wait_for_selector(f'#jobs-table tr[data-job="{waiting}"] .job-reason')
            await page.wait_for_selector(f'#jobs-table tr[data-job="{pp4}"][data-state="running"]')
            await shot("overview")

            await page.goto(f"{c.base}/#/jobs/{a}?overlay={b}")
            await page.wait_for_selector(f'#chart-loss[data-points="{gpt["train"]["steps"]}"]')
            await page.wait_for_selector("#tl-measured [data-lane]")
            await shot("job")

            await page.goto(f"{c.base}/#/plan?job={pp4}")
            await page.wait_for_selector('#plan-compare-table tr[data-schedule="zb-h1"]')
            await page.click('#plan-compare-table tr[data-schedule="zb-h1"] button')
            await page.wait_for_selector('#plan-detail [data-schedule="zb-h1"]')
            await shot("plan")
            await ctx.close()

        await c.cancel(pp4)
        state = await c.ended(pp4)
        if state != "cancelled":
            raise AssertionError(f"job {pp4} ended {state}, not cancelled")
        await c.ended(waiting)
        ok = True
    finally:
        await c.stop_all()
        # the daemons' state and chromium's profile (~33 MB a run): kept only to read a failure's logs
        if ok:
            c.remove_scratch()
        else:
            say(f"scratch kept: {c.tmp}")


if __name__ == "__main__":
    asyncio.run(main())

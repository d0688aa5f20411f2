// screenshots.mjs: the dashboard pictures in docs/screenshots/, taken from a
// real cluster doing real work (not the browser test's fixture, whose job
// name is an XSS payload): a coordinator and four workers on loopback train
// the example GPT at two learning rates side by side, a run that diverges,
// the 4-rank example while another job waits for workers; then chromium
// photographs the overview, the job page (the first run, the second
// overlaid) and the plan page (the 4-rank example's schedules compared).
//
//   docs/screenshots.sh            (tests/browser/run.sh BUILD . screenshots.mjs)
// Writes PW_SCREENSHOTS_DIR (default SOURCE/docs/screenshots): overview.png,
// job.png, plan.png.
import fs from 'node:fs';
import path from 'node:path';
import {createRequire} from 'node:module';
import {Cluster, waitFor} from './cluster.mjs';

const require = createRequire(import.meta.url);
const {chromium} = require('playwright-core');
const BUILD = process.env.PW_BUILD_DIR, SOURCE = process.env.PW_SOURCE_DIR, OUT = process.env.PW_DASHBOARD_OUT;
const CHROMIUM = process.env.PW_CHROMIUM || '/usr/bin/chromium';
if (!BUILD || !SOURCE || !OUT) throw new Error('run through tests/browser/run.sh BUILD SOURCE screenshots.mjs');
const DIR = process.env.PW_SCREENSHOTS_DIR || path.join(SOURCE, 'docs', 'screenshots');

const example = (f) => JSON.parse(fs.readFileSync(path.join(SOURCE, 'examples', 'jobs', f), 'utf8'));
const say = (m) => console.log(`screenshots: ${m}`);

const c = new Cluster({build: BUILD, source: SOURCE, out: OUT});
let ok = false;
try {
  await c.coordinator();
  await c.workers(4, 'w');
  const done = (id) => waitFor(`job ${id} to end`, async () => {
    const s = await c.state(id);
    return ['succeeded', 'failed', 'cancelled'].includes(s) && s;
  }, 600000);

  // the example GPT at two learning rates, side by side on two workers each
  const gpt = example('gpt-tiny.json');
  gpt.train.steps = 200;
  gpt.train.eval_every = 25; // the held-out loss beside the training loss
  const slow = structuredClone(gpt);
  slow.name = 'gpt-tiny lr 1e-3';
  slow.train.optimizer.lr = 1e-3;
  slow.train.optimizer.min_lr = 1e-4;
  const a = await c.submit(gpt), b = await c.submit(slow);
  say(`jobs ${a} and ${b} training`);
  await done(a);
  await done(b);
  // a run that diverges (its failure reason shows in the overview)
  const div = structuredClone(gpt);
  div.name = 'gpt-tiny lr 30';
  div.train.optimizer.lr = 30;
  div.train.optimizer.min_lr = 3;
  div.train.grad_clip = 0;
  await done(await c.submit(div));
  // the 4-rank example running while a 2-rank job waits for workers; it runs
  // until cancelled after the pictures (its 20 steps take ~5 s, less than
  // chromium's start on a busy host: the overview missed it running once)
  const pp4spec = example('gpt-pp4.json');
  pp4spec.train.steps = 2000;
  const pp4 = await c.submit(pp4spec);
  const llama = example('llama-tiny.json');
  llama.train.steps = 50;
  const waiting = await c.submit(llama);
  await waitFor('the 4-rank job running', async () => (await c.state(pp4)) === 'running', 60000);

  const ctx = await chromium.launchPersistentContext(fs.mkdtempSync(path.join(c.tmp, 'chromium-')), {
    executablePath: CHROMIUM, headless: true, viewport: {width: 1400, height: 900},
    args: ['--no-sandbox', '--disable-gpu', '--no-first-run', '--disable-background-networking',
           '--disable-component-update', '--disable-sync', '--disable-dev-shm-usage'],
  });
  const page = ctx.pages()[0] || await ctx.newPage();
  page.setDefaultTimeout(60000);
  fs.mkdirSync(DIR, {recursive: true});
  const shot = async (name) => {
    await page.waitForTimeout(500); // the charts settle after their last data
    await page.screenshot({path: path.join(DIR, `${name}.png`), fullPage: true});
    say(`${path.join(DIR, name + '.png')}`);
  };

  await page.goto(`${c.base}/#/`);
  await page.waitForSelector(`#jobs-table tr[data-job="${waiting}"] .job-reason`);
  await page.waitForSelector(`#jobs-table tr[data-job="${pp4}"][data-state="running"]`);
  await shot('overview');

  await page.goto(`${c.base}/#/jobs/${a}?overlay=${b}`);
  await page.waitForSelector(`#chart-loss[data-points="${gpt.train.steps}"]`);
  await page.waitForSelector('#tl-measured [data-lane]');
  await shot('job');

  await page.goto(`${c.base}/#/plan?job=${pp4}`);
  await page.waitForSelector('#plan-compare-table tr[data-schedule="zb-h1"]');
  await page.click('#plan-compare-table tr[data-schedule="zb-h1"] button');
  await page.waitForSelector('#plan-detail [data-schedule="zb-h1"]');
  await shot('plan');
  await ctx.close();
  const r = await c.api(`/v1/jobs/${pp4}`, {method: 'DELETE'});
  if (r.status !== 200) throw new Error(`cancel job ${pp4}: ${r.status} ${JSON.stringify(r.json)}`);
  if (await done(pp4) !== 'cancelled') throw new Error(`job ${pp4} did not end cancelled`);
  await done(waiting);
  ok = true;
} finally {
  await c.stopAll();
  // the daemons' state and chromium's profile (~33 MB a run): kept only to read a failure's logs
  if (ok) fs.rmSync(c.tmp, {recursive: true, force: true});
  else say(`scratch kept: ${c.tmp}`);
}

// dashboard.test.mjs: the web dashboard in a real browser, end to end.
//
// Starts a real pipewright-coordinator (ephemeral ports, --ready-file, a
// temporary state dir, --web pointing at web/, and an API token so the
// page's token prompt is exercised) and two real pipewright-workers,
// submits a small pp=2 GPT job over HTTP whose name holds a <script> tag,
// then drives Debian's chromium (headless, through playwright-core) over
// the overview, job and plan pages and checks what a user would see:
//   - the job appears in the overview and reaches `succeeded`;
//   - the loss chart plots one point per training step;
//   - the loss, lr, gradient norm, tokens/s and step time charts plot every
//     metrics row; smoothing (TensorBoard's debiased EMA) changes the
//     plotted value as computed here, the log toggle sets the scale, hover
//     shows the step's value, and both settings survive a reload;
//   - a diverged job's null step is a gap, not 0; another job overlaid adds
//     a series named "job N name" (as text), carried by the URL's hash;
//   - the overview says why a job waits ("waiting for 4 idle workers") and
//     why one failed (its error);
//   - the timeline of a chosen step has one lane per pipeline rank and one
//     F block per (microbatch, stage), measured and planned alike;
//   - the job name renders as text (no script element, no alert dialog);
//   - the plan page compares the schedules and draws the chosen one, and a
//     regions model's region graph with its timeline lanes by region;
//   - the generate page, on a serve job of the first job's weights, streams
//     the API's tokens, shows the request's latency, and the prompt (markup)
//     as text;
//   - with two more workers, a pp=4 job's 4 one-thread ranks share this
//     machine's cores: the job page shows the contention note (as text,
//     with its explanation) and the timeline a third, shared-cores bubble;
//   - a pp 2 x tp 2 job: the job list and overview show its tp, the overview's workers their coordinates, the
//     job page a grid of which worker holds each (pipeline rank, replica, tp
//     rank), the partition a stage's tp group, why snapshots are off, and
//     the measured timeline its lanes by coordinate in two tp groups with
//     their all-reduce strips; the plan page at pp 2 x dp 2 x tp 2 gives
//     each rank's dp and tp bytes per step and a DP block at its step's end.
// Screenshots go to PW_DASHBOARD_OUT (the pictures in docs/screenshots/ come
// from screenshots.mjs: a cluster doing real work). Run through
// tests/browser/run.sh.
import {test} from 'node:test';
import assert from 'node:assert/strict';
import {spawn} from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import {createRequire} from 'node:module';
import {sleep, stop, waitFor} from './cluster.mjs';

const require = createRequire(import.meta.url);
const {chromium} = require('playwright-core');

const BUILD = process.env.PW_BUILD_DIR;
const SOURCE = process.env.PW_SOURCE_DIR;
const OUT = process.env.PW_DASHBOARD_OUT;
const CHROMIUM = process.env.PW_CHROMIUM || '/usr/bin/chromium';
if (!BUILD || !SOURCE || !OUT) throw new Error('run through tests/browser/run.sh (PW_BUILD_DIR, PW_SOURCE_DIR, PW_DASHBOARD_OUT)');

// <script> never runs from innerHTML, but the <img onerror> would: both must show as text.
const NAME = 'dash <script>alert(1)</script><img src=x onerror=alert(2)> & "quotes"';
const PP = 2, MICROBATCHES = 4, STEPS = 20;
const SPEC = {
  name: NAME,
  model: {template: 'gpt', vocab_size: 256, seq_len: 16, d_model: 32, n_layers: 2, n_heads: 2},
  mesh: {pp: PP, dp: 1, virtual_stages: 1},
  schedule: {name: '1f1b', microbatches: MICROBATCHES},
  partition: {mode: 'even'},
  train: {steps: STEPS, batch_size: 8, seed: 1, checkpoint_every: 10},
  data: {kind: 'text', path: 'examples/data/corpus.txt', sampler: 'sequential'},
};
const SLOW = process.env.PW_SANITIZE === 'ON' ? 3 : 1; // ASan builds run slower

/* ---- processes ----------------------------------------------------------- */

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'pw-dashboard-'));
const procs = [];

function start(name, bin, args) {
  const log = fs.openSync(path.join(OUT, `${name}.log`), 'w');
  const p = spawn(path.join(BUILD, bin), args, {cwd: SOURCE, stdio: ['ignore', log, log],
    env: {...process.env, OPENBLAS_NUM_THREADS: '1'}});
  fs.closeSync(log);
  const rec = {name, p, exited: null};
  p.on('exit', (code, sig) => { rec.exited = {code, sig}; });
  procs.push(rec);
  return rec;
}

function logTail(name, n = 30) {
  try {
    return fs.readFileSync(path.join(OUT, `${name}.log`), 'utf8').split('\n').slice(-n).join('\n');
  } catch { return '(no log)'; }
}

process.on('exit', () => { for (const r of procs) if (!r.exited) r.p.kill('SIGKILL'); });

/* ---- the test ------------------------------------------------------------- */

test('dashboard in a real browser', {timeout: 600000 * SLOW}, async (t) => {
  const token = crypto.randomBytes(16).toString('hex');
  const tokenFile = path.join(tmp, 'api.token');
  fs.writeFileSync(tokenFile, token + '\n', {mode: 0o600});
  const ready = path.join(tmp, 'ready.json');
  const coord = start('coordinator', 'pipewright-coordinator', [
    '--http', '127.0.0.1:0', '--control', '127.0.0.1:0', '--state-dir', path.join(tmp, 'coordinator'),
    '--web', path.join(SOURCE, 'web'), '--token-file', tokenFile, '--ready-file', ready, '--data-root', SOURCE]);
  const ports = await waitFor('the coordinator\'s ready file', () => {
    if (coord.exited) throw new Error(`coordinator exited ${JSON.stringify(coord.exited)}:\n${logTail('coordinator')}`);
    return fs.existsSync(ready) && JSON.parse(fs.readFileSync(ready, 'utf8'));
  }, 20000 * SLOW);
  const base = `http://127.0.0.1:${ports.http}`;
  const auth = {Authorization: `Bearer ${token}`};
  const api = async (p, init = {}) => {
    const r = await fetch(base + p, {...init, headers: {...auth, ...(init.headers || {})}});
    const body = await r.text();
    return {status: r.status, json: body ? JSON.parse(body) : null};
  };

  for (let i = 0; i < 2; i++) {
    start(`worker${i}`, 'pipewright-worker', ['--coordinator', `127.0.0.1:${ports.control}`, '--listen', '127.0.0.1:0',
      '--name', `dash-w${i}`, '--state-dir', path.join(tmp, `w${i}`)]);
  }
  await waitFor('2 idle workers', async () => {
    const r = await api('/v1/workers');
    return r.json.workers.filter((w) => w.state === 'idle').length === 2;
  }, 20000 * SLOW);

  // The API really wants the token (so the page's prompt is what gets it through).
  assert.equal((await fetch(base + '/v1/jobs')).status, 401, 'the API answers 401 without the token');

  const sub = await api('/v1/jobs', {method: 'POST', headers: {'Content-Type': 'application/json'},
                                     body: JSON.stringify(SPEC)});
  assert.equal(sub.status, 201, `submit: ${JSON.stringify(sub.json)}`);
  const id = sub.json.id;

  const profile = fs.mkdtempSync(path.join(tmp, 'chromium-'));
  const ctx = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM, headless: true, viewport: {width: 1400, height: 900},
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
           '--disable-component-update', '--disable-sync', '--disable-dev-shm-usage'],
  });
  const page = ctx.pages()[0] || await ctx.newPage();
  page.setDefaultTimeout(30000 * SLOW);
  const dialogs = [], pageErrors = [], consoleErrors = [];
  page.on('dialog', (d) => { dialogs.push({type: d.type(), message: d.message()}); d.dismiss().catch(() => {}); });
  page.on('pageerror', (e) => pageErrors.push(e.message));
  page.on('console', (m) => { if (m.type() === 'error') consoleErrors.push(m.text()); });
  const shot = async (name) => {
    await page.waitForTimeout(300); // let the charts settle after the last data
    await page.screenshot({path: path.join(OUT, `${name}.png`), fullPage: true});
  };

  try {
    await t.test('the page asks for the API token and then loads', async () => {
      await page.goto(base + '/#/');
      await page.waitForSelector('#token-dialog[open]');
      await page.fill('#token-input', token);
      await page.click('#token-ok');
      await page.waitForSelector('#workers-table tr[data-worker="dash-w0"]');
      assert.equal(await page.evaluate(() => sessionStorage.getItem('pipewright.token')), token);
      assert.equal(await page.locator('#workers-table tr[data-worker]').count(), 2, 'one row per worker');
    });

    await t.test('the workers table shows each OpenBLAS kernel, its sgemm rate and any warning', async () => {
      const w = (await api('/v1/workers')).json.workers.find((x) => x.name === 'dash-w0');
      const row = page.locator('#workers-table tr[data-worker="dash-w0"]');
      const kernel = await row.locator('.worker-kernel').textContent();
      assert.ok(w.blas_core && kernel.startsWith(w.blas_core + (w.blas_forced ? ' (forced)' : '')), kernel);
      assert.match(await row.locator('.worker-gemm').textContent(), /^[0-9,]+ GF\/s$/);
      // the coordinator's sentences, as text (none when the kernel is OpenBLAS's own pick)
      assert.deepEqual(await row.locator('.worker-warning').allTextContents(), w.warnings);
    });

    await t.test('the job appears in the overview and reaches succeeded', async () => {
      const row = page.locator(`#jobs-table tr[data-job="${id}"]`);
      await row.waitFor();
      // the overview refreshes on its own: no reload here
      await page.waitForSelector(`#jobs-table tr[data-job="${id}"][data-state="succeeded"]`, {timeout: 180000 * SLOW});
      assert.equal(await row.locator('.job-name').textContent(), NAME, 'the name shows as typed');
      assert.equal(await row.locator('.progress .label').textContent(), `${STEPS}/${STEPS}`);
      await shot('overview');
    });

    await t.test('the job page: loss curve with one point per step', async () => {
      await page.click(`#jobs-table tr[data-job="${id}"] .job-name`);
      await page.waitForSelector('#job-state [data-state="succeeded"]');
      const metrics = (await api(`/v1/jobs/${id}/metrics`)).json.metrics;
      assert.equal(metrics.length, STEPS, 'the API holds a metric row per step');
      await page.waitForSelector(`#chart-loss[data-points="${STEPS}"]`);
      await page.waitForSelector(`#chart-throughput[data-points="${STEPS}"]`);
      assert.equal(await page.locator('#chart-loss canvas').count() > 0, true, 'uPlot drew a canvas');
      assert.equal(await page.textContent('#job-name'), NAME);
      assert.equal(await page.locator('#job-cancel').isHidden(), true, 'no cancel button on a finished job');
      assert.equal(await page.locator('#partition-table tbody tr[data-stage]').count(), PP, 'a partition row per stage');
      // the attempts: one run, succeeded, on both workers (by rank), no restart
      const attempts = page.locator('#attempts-table tbody tr[data-attempt]');
      assert.equal(await attempts.count(), 1, 'one attempt row per run');
      assert.equal(await attempts.first().getAttribute('data-state'), 'succeeded');
      const workers = (await attempts.first().locator('.attempt-workers').textContent()).split(', ').sort();
      assert.deepEqual(workers, ['dash-w0', 'dash-w1'], 'the attempt names its workers');
      assert.equal(await page.textContent('#job-restarts'), '0 of 3');
      assert.equal(await page.locator('#job-retry').isHidden(), true, 'no retry button on a succeeded job');
    });

    await t.test('the checkpoint downloads through the page (with the token)', async () => {
      const [dl] = await Promise.all([page.waitForEvent('download'), page.click('#job-checkpoint')]);
      assert.match(dl.suggestedFilename(), /\.safetensors$/);
      const buf = fs.readFileSync(await dl.path());
      const n = Number(buf.readBigUInt64LE(0));
      const header = JSON.parse(buf.subarray(8, 8 + n).toString('utf8'));
      assert.ok(header['embed.tok.weight'] && header['lm_head.weight'], 'the whole model in one safetensors file');
    });

    await t.test('the timeline of a chosen step: a lane per rank, an F per microbatch and stage', async () => {
      await page.waitForSelector('#tl-measured [data-lane]');
      const steps = await page.$$eval('#timeline-step option', (os) => os.map((o) => o.value).filter((v) => v !== ''));
      assert.ok(steps.length >= 1, 'at least one sampled step');
      // choose the step that ran closest to plan (the least measured bubble), among
      // those every rank traced (a rank whose trace buffers were all busy, on a
      // loaded machine, leaves that step untraced: one lane)
      let chosen = steps[0], best = Infinity;
      for (const st of steps) {
        const tl = (await api(`/v1/jobs/${id}/timeline?step=${st}`)).json;
        if ((tl.ranks || []).length !== PP) continue;
        const b = tl.bubble.measured;
        if (typeof b === 'number' && b < best) { best = b; chosen = st; }
      }
      await page.selectOption('#timeline-step', chosen);
      await page.waitForFunction((s) => document.getElementById('tl-measured-title').textContent
        .includes(`step ${s} `), chosen);
      const S = PP; // 1f1b: one stage per rank
      assert.equal(await page.locator('#tl-measured [data-lane]').count(), PP, 'measured: one lane per rank');
      assert.equal(await page.locator('#tl-measured [data-kind="F"]').count(), MICROBATCHES * S,
                   'measured: microbatches x stages F blocks');
      assert.equal(await page.locator('#tl-measured [data-kind="B"]').count(), MICROBATCHES * S,
                   'measured: as many B blocks');
      for (let s = 0; s < S; s++) {
        assert.equal(await page.locator(`#tl-measured [data-lane="${s}"] [data-kind="F"][data-stage="${s}"]`).count(),
                     MICROBATCHES, `rank ${s} runs the F of stage ${s} for every microbatch`);
      }
      assert.equal(await page.locator('#tl-planned [data-lane]').count(), PP, 'planned: one lane per rank');
      assert.equal(await page.locator('#tl-planned [data-kind="F"]').count(), MICROBATCHES * S);
      const bubble = await page.textContent('#timeline-bubble-measured .bubble-value');
      assert.match(bubble, /^\d+(\.\d)?%$/, 'the measured bubble ratio is shown');
      assert.match(await page.textContent('#timeline-bubble-planned .bubble-value'), /^\d+(\.\d)?%$/);
      const href = await page.getAttribute('#timeline-trace', 'href');
      assert.equal(href, `/v1/jobs/${id}/timeline?step=${chosen}&format=chrome`);
      await shot('job');
    });

    await t.test('the plan page compares schedules and draws the chosen one', async () => {
      await page.goto(`${base}/#/plan?job=${id}`);
      await page.waitForSelector('#plan-compare-table tr[data-schedule="1f1b"]');
      const rows = await page.locator('#plan-compare-table tbody tr[data-schedule]').count();
      const cmp = await api('/v1/plans?compare=1', {method: 'POST', body: JSON.stringify(SPEC)});
      assert.equal(rows, cmp.json.rows.length, 'a row per schedule the API compares');
      await page.waitForSelector('#plan-detail [data-schedule="1f1b"]');
      await page.click('#plan-compare-table tr[data-schedule="zb-h1"] button');
      await page.waitForSelector('#plan-detail [data-schedule="zb-h1"]');
      assert.equal(await page.locator('#plan-timeline [data-lane]').count(), PP);
      assert.equal(await page.locator('#plan-timeline [data-kind="W"]').count(), MICROBATCHES * PP,
                   'zb-h1 splits every backward: a W per microbatch and stage');
      // each rank's in-memory snapshot bytes per step (snapshot_every defaults to 1), as the API plans them
      const zb = (await api('/v1/plans?schedule=zb-h1', {method: 'POST', body: JSON.stringify(SPEC)})).json;
      const kib = (x) => (x >= 1024 ? (x / 1024).toFixed(1) + ' KiB' : x.toFixed(0) + ' B');
      for (const [k, r] of zb.analytics.ranks.entries()) {
        assert.ok(r.snapshot_bytes_per_step > 0, `rank ${k}: the plan has snapshot bytes`);
        assert.ok((await page.textContent(`#plan-ranks tbody tr:nth-child(${k + 1}) .plan-snap`))
          .startsWith(`snap ${kib(r.snapshot_bytes_per_step)} \u00b7 `), `rank ${k} snap`);
      }
      await shot('plan');
    });

    // A custom schedule: export the shown plan (zb-h1), check it as it is
    // (the simulator proves it: "ok" with the same bubble), then with one
    // action deleted (the verdict names it). The ok verdict needs the
    // job spec's schedule.custom (issue 22 part 1) in the coordinator.
    await t.test('the plan page exports, checks and refuses custom schedules', async () => {
      const spec = {...SPEC, schedule: {name: 'zb-h1', microbatches: MICROBATCHES}};
      const want = (await api('/v1/plans?schedule=zb-h1', {method: 'POST', body: JSON.stringify(spec)})).json;
      // the model-free bubble beside the model's (GET /v1/schedules/zb-h1/analytics)
      await page.waitForFunction(() => /^without the model \(unit costs\): bubble [0-9.]+%/
        .test(document.getElementById('plan-unit-bubble').textContent));
      const [dl] = await Promise.all([page.waitForEvent('download'), page.click('#plan-custom-export')]);
      assert.equal(dl.suggestedFilename(), 'zb-h1-custom.json');
      const exported = JSON.parse(fs.readFileSync(await dl.path(), 'utf8'));
      assert.deepEqual(exported, {ranks: want.plan.ranks}, 'the download is the plan\'s ranks as schedule.custom');
      assert.equal(await page.inputValue('#plan-custom'), want.plan.ranks.join('\n'), 'and fills the editor');

      // pasted back as a user would, then checked
      await page.fill('#plan-custom', '');
      await page.fill('#plan-custom', exported.ranks.join('\n') + '\n');
      await page.click('#plan-custom-check');
      await page.waitForSelector('#plan-custom-verdict[data-verdict]');
      const ok = await page.textContent('#plan-custom-verdict');
      assert.equal(await page.getAttribute('#plan-custom-verdict', 'data-verdict'), 'ok', `verdict: ${ok}`);
      assert.ok(ok.includes(`bubble ${(100 * want.analytics.bubble_ratio).toFixed(1)}%`), ok);
      await page.waitForSelector('#plan-detail [data-schedule="custom"]');
      assert.equal(await page.locator('#plan-timeline [data-kind="W"]').count(), MICROBATCHES * PP,
                   'the checked plan is drawn: zb-h1\'s W blocks');

      // one action deleted: rank 0's last (a W of zb-h1)
      const rows = exported.ranks.map((r) => r.split(' '));
      const gone = rows[0].pop();
      assert.match(gone, /^W\d+@s0$/);
      await page.fill('#plan-custom', rows.map((r) => r.join(' ')).join('\n'));
      await page.click('#plan-custom-check');
      await page.waitForSelector('#plan-custom-verdict[data-verdict="error"]');
      const bad = await page.textContent('#plan-custom-verdict');
      assert.ok(bad.startsWith('error: ') && bad.includes(gone), `the error names ${gone}: ${bad}`);
      await shot('plan-custom');
    });

    // A regions model (examples/jobs/two-tower.json): one row, its regions'
    // own schedules; the region graph; planned lanes labelled by region.
    await t.test('the plan page draws a regions model: the region graph and lanes by region', async () => {
      const tt = JSON.parse(fs.readFileSync(path.join(SOURCE, 'examples/jobs/two-tower.json'), 'utf8'));
      await page.fill('#plan-spec', JSON.stringify(tt, null, 2));
      await page.click('#plan-compare');
      await page.waitForSelector('#plan-detail [data-schedule="regions"]');
      assert.equal(await page.locator('#plan-compare-table tbody tr[data-schedule]').count(), 1);
      assert.deepEqual(await page.locator('#plan-regions .region-box').evaluateAll((els) => els.map((e) => e.dataset.region)),
                       ['text', 'vision', 'head']);
      assert.match(await page.textContent('#plan-regions .region-box[data-region="head"]'), /text \+ vision \(concat\)/);
      assert.match(await page.textContent('#plan-regions .region-box[data-region="vision"]'), /zb-h1 · ranks 2–3/);
      assert.equal(await page.locator('#plan-timeline [data-region="text"]').count(), 2, 'text: ranks 0 and 1');
      assert.equal(await page.locator('#plan-timeline [data-region="head"]').count(), 1);
      assert.match(await page.textContent('#plan-timeline [data-region="vision"] .lane-label'), /^vision r2$/);
      await shot('plan-regions');
    });

    // The training curves: five charts, smoothing, log scale, hover and
    // overlaid jobs; a diverged job (its null step is a gap, not 0) and a
    // job that waits for workers give the overview's reason lines.
    const NAME2 = 'div <b>x</b><img src=x onerror=alert(3)>';
    const CHARTS = {'chart-loss': 'loss', 'chart-lr': 'lr', 'chart-grad-norm': 'grad_norm',
                    'chart-throughput': 'tokens_per_s', 'chart-step-time': 'step_time'};
    const ema = (ys, w) => { // TensorBoard's debiased EMA, nulls skipped
      let last = 0, n = 0;
      return ys.map((y) => (y === null ? null : (last = last * w + (1 - w) * y, n++, last / (1 - Math.pow(w, n)))));
    };
    const close = (a, b, what) => assert.ok(Math.abs(a - b) <= 1e-9 * Math.max(1, Math.abs(b)), `${what}: ${a} vs ${b}`);
    const attr = (sel, a) => page.getAttribute(sel, a);
    const fmt3 = (x) => String(Number(x.toPrecision(3))); // the legend's numbers below 1000
    const setSmoothing = (chart, w) => page.$eval(`#${chart} .chart-smooth`, (el, v) => {
      el.value = String(v);
      el.dispatchEvent(new Event('input', {bubbles: true}));
    }, w);
    let fid, qid;

    await t.test('the job page charts loss, lr, gradient norm, tokens/s and step time', async () => {
      // the failing and the waiting job, submitted now (the plan tests are done with the workers)
      const bad = {...SPEC, name: NAME2, train: {steps: 6, batch_size: 8, seed: 1, grad_clip: 0,
                                                 optimizer: {name: 'sgd', lr: 1e30}}};
      const r1 = await api('/v1/jobs', {method: 'POST', headers: {'Content-Type': 'application/json'},
                                        body: JSON.stringify(bad)});
      assert.equal(r1.status, 201, JSON.stringify(r1.json));
      fid = r1.json.id;

      await page.goto(`${base}/#/jobs/${id}`);
      const rows = (await api(`/v1/jobs/${id}/metrics`)).json.metrics;
      for (const [chart, key] of Object.entries(CHARTS)) {
        await page.waitForSelector(`#${chart}[data-points="${rows.length}"]`);
        assert.equal(await page.locator(`#${chart} canvas`).count() > 0, true, `${chart}: uPlot drew a canvas`);
        assert.equal(await attr(`#${chart}`, 'data-series'), '1');
        const w = Number(await attr(`#${chart}`, 'data-smoothing'));
        const want = ema(rows.map((r) => r[key]), w).at(-1);
        close(Number(await attr(`#${chart}`, 'data-last')), want, `${chart}'s last smoothed value at ${w}`);
      }
      assert.equal(await attr('#chart-lr', 'data-smoothing'), '0', 'lr is not smoothed by default');
      assert.equal(await attr('#chart-loss', 'data-smoothing'), '0.6', 'loss is, at 0.6');
      assert.equal(Number(await attr('#chart-lr', 'data-last')), rows.at(-1).lr, 'unsmoothed: the last lr itself');
    });

    await t.test('smoothing, log scale and hover; the settings persist', async () => {
      const loss = (await api(`/v1/jobs/${id}/metrics`)).json.metrics.map((r) => r.loss);
      await setSmoothing('chart-loss', 0);
      await page.waitForSelector('#chart-loss[data-smoothing="0"]');
      assert.equal(Number(await attr('#chart-loss', 'data-last')), loss.at(-1), 'no smoothing: the raw last loss');
      await setSmoothing('chart-loss', 0.9);
      await page.waitForSelector('#chart-loss[data-smoothing="0.9"]');
      const smoothed = Number(await attr('#chart-loss', 'data-last'));
      close(smoothed, ema(loss, 0.9).at(-1), 'smoothed at 0.9');
      assert.notEqual(smoothed, loss.at(-1), 'smoothing moved the plotted value');
      assert.equal(await page.textContent('#chart-loss .chart-smooth-value'), '0.90');

      assert.equal(await attr('#chart-loss', 'data-log'), '0');
      await page.check('#chart-loss .chart-log');
      await page.waitForSelector('#chart-loss[data-log="1"]');
      assert.equal(await page.locator('#chart-loss .chart-log').isDisabled(), false, 'losses are > 0');
      assert.equal(await page.textContent('#chart-loss .chart-note'), '');

      // hover: the legend follows the cursor with the step and the value there
      const over = page.locator('#chart-loss .u-over');
      const box = await over.boundingBox();
      await page.mouse.move(box.x + box.width / 2, box.y + box.height / 2);
      await page.waitForFunction(() => document.querySelector('#chart-loss .chart-legend').dataset.step !== '');
      const step = Number(await attr('#chart-loss .chart-legend', 'data-step'));
      assert.ok(step > 0 && step < STEPS - 1, `mid-chart step ${step}`);
      assert.equal(await page.textContent('#chart-loss .chart-legend-step'), `step ${step}`);
      const shown = await page.textContent(`#chart-loss .chart-legend-item[data-job="${id}"] .chart-legend-value`);
      assert.ok(shown.startsWith(fmt3(ema(loss, 0.9)[step])), `legend value at step ${step}: ${shown}`);
      await page.mouse.move(0, 0);

      await page.reload();
      await page.waitForSelector(`#chart-loss[data-points="${loss.length}"]`);
      assert.equal(await attr('#chart-loss', 'data-smoothing'), '0.9', 'smoothing kept in localStorage');
      assert.equal(await attr('#chart-loss', 'data-log'), '1', 'and the log scale');
      await page.uncheck('#chart-loss .chart-log');
      await page.waitForSelector('#chart-loss[data-log="0"]');
      await shot('job-curves');

      // a series with a value <= 0 cannot have a log axis: the toggle says why (a scratch chart)
      const scratch = await page.evaluate(() => {
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
      });
      assert.deepEqual(scratch[0], {log: '0', disabled: true, note: 'log scale needs values > 0', last: '0'});
      assert.deepEqual(scratch[1], {log: '1', disabled: false, note: '', last: '10'}, 'the null step is a gap, not 0');
    });

    await t.test('a diverged job: its null step is a gap, not 0', async () => {
      const j = await waitFor(`job ${fid} to fail`, async () => {
        const r = (await api(`/v1/jobs/${fid}`)).json;
        return r.state === 'failed' && r;
      }, 120000 * SLOW);
      assert.match(j.error, /diverged at step 1/);
      const rows = (await api(`/v1/jobs/${fid}/metrics`)).json.metrics;
      assert.ok(rows.length >= 2 && rows[1].loss === null && rows[0].loss > 0, JSON.stringify(rows));
      await page.goto(`${base}/#/jobs/${fid}`);
      await page.waitForSelector(`#chart-loss[data-points="${rows.length}"]`);
      // one finite point: its debiased average is itself, whatever the weight (0 would pull it down)
      close(Number(await attr('#chart-loss', 'data-last')), rows[0].loss, 'the last plotted loss');
      close(Number(await attr('#chart-grad-norm', 'data-last')), rows[0].grad_norm, 'the last plotted grad norm');
    });

    await t.test('other jobs overlaid: a series each, named in the legend, carried by the URL', async () => {
      await page.goto(`${base}/#/jobs/${id}`);
      await page.waitForSelector(`#chart-loss[data-points="${STEPS}"]`);
      assert.equal(await attr('#chart-loss', 'data-series'), '1');
      await page.fill('#overlay-input', ` ${fid} `);
      await page.click('#overlay-apply');
      for (const chart of Object.keys(CHARTS)) await page.waitForSelector(`#${chart}[data-series="2"]`);
      assert.equal(await page.evaluate(() => location.hash), `#/jobs/${id}?overlay=${fid}`);
      const label = page.locator(`#chart-loss .chart-legend-item[data-job="${fid}"] .chart-legend-label`);
      assert.equal(await label.textContent(), `job ${fid} ${NAME2}`, 'the legend names the job, as text');
      assert.equal(await page.locator('#charts-card img, #charts-card b').count(), 0, 'no markup made from the name');
      assert.equal(await page.textContent(`#chart-loss .chart-legend-item[data-job="${id}"] .chart-legend-label`),
                   `job ${id} ${NAME}`);

      // shared as a link: the overlay comes back from the URL alone
      await page.goto(`${base}/#/jobs/${id}?overlay=${fid}`);
      await page.reload();
      await page.waitForSelector(`#chart-lr[data-series="2"]`);
      assert.equal(await page.inputValue('#overlay-input'), String(fid));

      // the recent jobs' list adds one
      const r2 = await api('/v1/jobs', {method: 'POST', headers: {'Content-Type': 'application/json'},
                                        body: JSON.stringify({...SPEC, name: 'dash-wait', mesh: {pp: 2, dp: 2}})});
      assert.equal(r2.status, 201, JSON.stringify(r2.json));
      qid = r2.json.id;
      await page.focus('#overlay-pick');
      await page.waitForSelector(`#overlay-pick option[value="${qid}"]`, {state: 'attached'});
      await page.selectOption('#overlay-pick', String(qid));
      await page.waitForSelector('#chart-loss[data-series="3"]');
      assert.equal(await page.inputValue('#overlay-input'), `${fid}, ${qid}`);
      assert.equal(await page.evaluate(() => location.hash), `#/jobs/${id}?overlay=${fid},${qid}`);
      await shot('job-overlay');
    });

    await t.test('the overview says why a job waits and why one failed', async () => {
      await page.goto(base + '/#/');
      const wait = page.locator(`#jobs-table tr[data-job="${qid}"][data-state="queued"] .job-reason`);
      await page.waitForFunction((q) => /^waiting for 4 idle workers/.test(
        (document.querySelector(`#jobs-table tr[data-job="${q}"] .job-reason`) || {}).textContent || ''), qid);
      assert.match(await wait.textContent(), /^waiting for 4 idle workers \(2 idle, 0 busy connected\)$/);
      const err = (await api(`/v1/jobs/${fid}`)).json.error;
      assert.equal(await page.textContent(`#jobs-table tr[data-job="${fid}"][data-state="failed"] .job-reason`), err);
      assert.equal(await page.locator(`#jobs-table tr[data-job="${id}"] .job-reason`).count(), 0,
                   'a succeeded job has no reason line');
      await shot('overview-reasons');
      assert.equal((await api(`/v1/jobs/${qid}`, {method: 'DELETE'})).status, 200);
    });

    await t.test('train.eval_every: the loss chart has an eval series, a point per evaluated step', async () => {
      const r = await api('/v1/jobs', {method: 'POST', headers: {'Content-Type': 'application/json'}, body: JSON.stringify(
        {...SPEC, name: 'dash-eval', train: {steps: 6, batch_size: 8, seed: 1, eval_every: 3, eval_batches: 1}})});
      assert.equal(r.status, 201, JSON.stringify(r.json));
      const eid = r.json.id;
      await waitFor(`job ${eid} to succeed`, async () => (await api(`/v1/jobs/${eid}`)).json.state === 'succeeded',
                    120000 * SLOW);
      const rows = (await api(`/v1/jobs/${eid}/metrics`)).json.metrics;
      assert.deepEqual(rows.filter((m) => m.eval_loss !== null).map((m) => m.step), [2, 5], JSON.stringify(rows));
      await page.goto(`${base}/#/jobs/${eid}`);
      await page.waitForSelector('#chart-loss[data-points="6"][data-eval-points="2"]');
      assert.equal(await attr('#chart-loss', 'data-series'), '1', 'the eval series is the same job\'s');
      const items = page.locator(`#chart-loss .chart-legend-item[data-job="${eid}"]`);
      assert.equal(await items.count(), 2, 'the legend has the training and the eval loss');
      assert.equal(await items.nth(1).locator('.chart-legend-label').textContent(), `job ${eid} dash-eval eval`);
      assert.equal(await items.nth(1).locator('.chart-legend-value').textContent(), fmt3(rows[5].eval_loss),
                   'the last eval loss (step 6)');
      await shot('job-eval');
    });

    await t.test('the generate page: a serve job\'s tokens stream in, with their latency; the prompt is text', async () => {
      const r = await api('/v1/jobs', {method: 'POST', headers: {'Content-Type': 'application/json'}, body: JSON.stringify(
        {...SPEC, name: 'dash-serve', mode: 'serve', init: {job: id, step: STEPS}, serve: {max_sequences: 2}})});
      assert.equal(r.status, 201, JSON.stringify(r.json));
      const gid = r.json.id;
      await waitFor(`job ${gid} to serve`, async () => {
        const j = (await api(`/v1/jobs/${gid}`)).json;
        return j.state === 'running' && j.status === 'serving';
      }, 60000 * SLOW);
      try {
        const prompt = '<b>hi</b>'; /* 9 bytes and 8 new tokens: the 16 positions of seq_len */
        const want = (await api(`/v1/jobs/${gid}/generate`, {method: 'POST', headers: {'Content-Type': 'application/json'},
                                                             body: JSON.stringify({prompt, max_tokens: 8})})).json;
        assert.ok(want.results, JSON.stringify(want));
        const tokens = want.results[0].tokens;
        await page.goto(`${base}/#/generate?job=${gid}`);
        await page.waitForSelector(`#gen-job option[value="${gid}"]`, {state: 'attached'});
        assert.equal(await page.inputValue('#gen-job'), String(gid), 'the job from the URL is picked');
        await page.fill('#gen-prompt', prompt);
        await page.fill('#gen-max', '8');
        await page.click('#gen-go');
        await page.waitForSelector('#gen-history tr');
        assert.equal(await page.textContent('#gen-out'),
                     new TextDecoder().decode(new Uint8Array(tokens), {stream: true}), 'the same tokens as the API\'s');
        assert.match(await page.textContent('#gen-stats'),
                     /^8 tokens; time to first token [0-9.]+ ms; ([0-9.]+|\u2014) tokens\/s after it \(coordinator: [0-9.]+ ms, [0-9.]+ tokens\/s\)$/);
        assert.equal(await page.textContent('#gen-history tr td.mono'), prompt, 'the prompt shows as typed');
        assert.equal(await page.locator('#view b').count(), 0, 'no markup made from the prompt or the output');
        await shot('generate');
      } finally {
        assert.equal((await api(`/v1/jobs/${gid}`, {method: 'DELETE'})).status, 200);
      }
    });

    await t.test('user data renders as text: no script, no alert', async () => {
      await page.goto(base + '/#/');
      await page.waitForSelector(`#jobs-table tr[data-job="${id}"]`);
      assert.equal(await page.locator('#view script').count(), 0, 'no script element made from data');
      assert.equal(await page.evaluate(() => Array.from(document.scripts).every((s) => s.src.startsWith(location.origin))),
                   true, 'only the dashboard\'s own scripts');
      assert.deepEqual(dialogs.filter((d) => d.type === 'alert'), [], 'no alert fired');
      assert.deepEqual(pageErrors, [], 'no uncaught errors in the page');
      // (the browser logs every non-2xx fetch, such as the first 401, as "Failed to load resource")
      assert.deepEqual(consoleErrors.filter((m) => !/^Failed to load resource/.test(m)), [], 'no console errors');
    });

    await t.test('ranks that share cores: the job page notes it, the timeline shows the shared-cores bubble', async (st) => {
      // the workers report sysconf's online CPUs as their cores, as os.cpus() counts them
      const cores = os.cpus().length;
      if (cores >= 4) { st.skip(`${cores} cores: 4 one-thread ranks do not share them`); return; }
      for (let i = 2; i < 4; i++) {
        start(`worker${i}`, 'pipewright-worker', ['--coordinator', `127.0.0.1:${ports.control}`, '--listen',
          '127.0.0.1:0', '--name', `dash-w${i}`, '--state-dir', path.join(tmp, `w${i}`)]);
      }
      await waitFor('4 idle workers', async () =>
        (await api('/v1/workers')).json.workers.filter((w) => w.state === 'idle').length === 4, 20000 * SLOW);
      const spec = {...SPEC, name: 'dash-shared <b>x</b>', mesh: {pp: 4, dp: 1, virtual_stages: 1},
                    model: {...SPEC.model, n_layers: 4}, train: {...SPEC.train, steps: 4}};
      const r = await api('/v1/jobs', {method: 'POST', headers: {'Content-Type': 'application/json'},
                                       body: JSON.stringify(spec)});
      assert.equal(r.status, 201, JSON.stringify(r.json));
      const sid = r.json.id;
      const j = await waitFor(`job ${sid} to succeed`, async () => {
        const x = (await api(`/v1/jobs/${sid}`)).json;
        return x.state === 'succeeded' && x;
      }, 120000 * SLOW);
      assert.ok(j.contention, 'the job JSON carries contention');
      assert.match(j.contention.message, new RegExp(`^4 ranks with 1 thread each share ${cores} cores? on host `));
      const tl = (await api(`/v1/jobs/${sid}/timeline`)).json;
      assert.ok(tl.bubble.planned_shared > tl.bubble.planned, JSON.stringify(tl.bubble));

      await page.goto(`${base}/#/jobs/${sid}`);
      await page.waitForSelector('#job-contention:not([hidden])');
      assert.equal(await page.textContent('#job-contention-msg'), j.contention.message, 'the message, as text');
      assert.equal(await page.isHidden('#job-contention-doc'), true);
      await page.click('#job-contention-why');
      assert.match(await page.textContent('#job-contention-doc'), /docs\/architecture\.md, section .Ranks that share cores./);
      await page.waitForSelector('#timeline-bubble-shared');
      assert.equal(await page.textContent('#timeline-bubble-shared .bubble-value'),
                   (100 * tl.bubble.planned_shared).toFixed(1) + '%');
      assert.equal(await page.textContent('#timeline-bubble-planned .bubble-value'),
                   (100 * tl.bubble.planned).toFixed(1) + '%');
      assert.ok((await page.textContent('#timeline-shared-note')).includes(j.contention.message));
      await shot('job-contention');

      // the first job (2 one-thread ranks on this host's cores): no note, two bubbles
      await page.goto(`${base}/#/jobs/${id}`);
      await page.waitForSelector('#timeline-bubble-planned');
      assert.equal(await page.isHidden('#job-contention'), true, 'no contention note');
      assert.equal(await page.locator('#timeline-bubble-shared').count(), 0, 'no shared-cores bubble');
      assert.deepEqual(pageErrors, [], 'no uncaught errors in the page');
    });

    await t.test('a pp 2 x tp 2 job: the mesh grid, the workers\' coordinates, tp groups in the timeline', async () => {
      const have = (await api('/v1/workers')).json.workers.length;
      for (let i = have; i < 4; i++) {
        start(`worker${i}`, 'pipewright-worker', ['--coordinator', `127.0.0.1:${ports.control}`, '--listen',
          '127.0.0.1:0', '--name', `dash-w${i}`, '--state-dir', path.join(tmp, `w${i}`)]);
      }
      await waitFor('4 idle workers', async () =>
        (await api('/v1/workers')).json.workers.filter((w) => w.state === 'idle').length === 4, 20000 * SLOW);
      const spec = {...SPEC, name: 'dash-tp', mesh: {pp: 2, dp: 1, tp: 2, virtual_stages: 1},
                    train: {...SPEC.train, steps: 100000, checkpoint_every: 0}};
      const r = await api('/v1/jobs', {method: 'POST', headers: {'Content-Type': 'application/json'},
                                       body: JSON.stringify(spec)});
      assert.equal(r.status, 201, JSON.stringify(r.json));
      const tid = r.json.id;
      try {
        const j = await waitFor(`job ${tid} to run a sampled step`, async () => {
          const x = (await api(`/v1/jobs/${tid}`)).json;
          return x.state === 'running' && (x.progress || {}).step >= 1 && x.ranks.length === 4 && x;
        }, 60000 * SLOW);
        const label = (c) => `pp${c.pipeline_rank} dp${c.replica} tp${c.tp_rank}`;
        assert.deepEqual(j.ranks.map((k) => label(k.coordinate)),
                         ['pp0 dp0 tp0', 'pp0 dp0 tp1', 'pp1 dp0 tp0', 'pp1 dp0 tp1'], 'rank = (pp rank) x tp + tp rank');
        assert.equal(j.snapshots.every, 0);
        assert.match(j.snapshots.note, /tensor-parallel/);

        // the job list carries tp (from the spec) and the overview's mesh column shows it
        const listed = (await api('/v1/jobs')).json.jobs.find((x) => x.id === tid);
        assert.deepEqual(listed.mesh, {pp: 2, dp: 1, virtual_stages: 1, tp: 2});
        // the workers table: each busy worker's job, rank and coordinate
        await page.goto(base + '/#/');
        await page.waitForSelector(`#jobs-table tr[data-job="${tid}"]`);
        assert.equal(await page.textContent(`#jobs-table tr[data-job="${tid}"] td:nth-child(5)`), 'pp 2 \u00d7 dp 1 \u00d7 tp 2');
        await page.waitForSelector(`#workers-table tr[data-worker] .worker-coord`);
        for (const k of j.ranks) {
          assert.equal(await page.textContent(`#workers-table tr[data-worker="${k.worker}"] .worker-coord`),
                       ' \u00b7 ' + label(k.coordinate), `worker ${k.worker}`);
        }

        // the job page: a grid pp x tp per replica, each cell the worker at that coordinate
        await page.goto(`${base}/#/jobs/${tid}`);
        await page.waitForSelector('#job-mesh[data-tp="2"]');
        assert.equal(await page.locator('#job-mesh .mesh-replica').count(), 1, 'one replica');
        assert.equal(await page.locator('#job-mesh td.mesh-cell').count(), 4);
        for (const k of j.ranks) {
          const c = k.coordinate;
          assert.equal(await attr(`#job-mesh td[data-coord="${c.pipeline_rank},${c.replica},${c.tp_rank}"]`, 'data-worker'),
                       k.worker, label(c));
        }
        assert.equal(await page.textContent('#job-snapshots'), j.snapshots.note, 'the note, as the API says it');
        await page.waitForSelector('#partition-table tbody tr[data-stage="1"]');
        assert.equal(await page.textContent('#partition-table tr[data-stage="1"] td:nth-child(3)'),
                     j.ranks.filter((k) => k.coordinate.pipeline_rank === 1).map((k) => k.worker).join(', '),
                     'a stage\'s workers: its tp group');
        // the measured timeline: 4 lanes labelled by coordinate, two tp groups of two; the plan: a lane per pp rank
        await page.waitForSelector('#tl-measured[data-lanes="4"]');
        assert.deepEqual(await page.$$eval('#tl-measured g.lane', (gs) => gs.map((g) => g.getAttribute('data-tpgroup'))),
                         ['0', '0', '1', '1']);
        assert.deepEqual(await page.$$eval('#tl-measured g.lane .lane-label', (ts) => ts.map((x) => x.textContent)),
                         ['pp0 dp0 tp0', 'pp0 dp0 tp1', 'pp1 dp0 tp0', 'pp1 dp0 tp1']);
        assert.equal(await attr('#tl-planned', 'data-lanes'), '2');
        // each member's tensor-parallel all-reduces: strips inside its F and B blocks, their time on the lane
        for (let k = 0; k < 4; k++) {
          assert.ok(await page.locator(`#tl-measured g.lane[data-lane="${k}"] g.k-T`).count() > 0, `rank ${k}: T strips`);
          assert.match(await attr(`#tl-measured g.lane[data-lane="${k}"]`, 'data-coll'), /^tp [0-9.]+ (ms|\u00b5s|s)$/);
        }
        await shot('job-mesh-tp');

        // the plan page at pp 2 x dp 2 x tp 2: each rank's dp and tp volume per step, and its DP block at the step's end
        const mspec = {...spec, name: 'dash-mesh-plan', mesh: {pp: 2, dp: 2, tp: 2, virtual_stages: 1},
                       train: {...spec.train, batch_size: 16}};
        const plan = (await api('/v1/plans', {method: 'POST', body: JSON.stringify(mspec)})).json;
        assert.ok(plan.analytics && plan.analytics.step_makespan > plan.analytics.makespan, JSON.stringify(plan).slice(0, 300));
        // the first example is in the box as soon as the box is, not after the page's first request (the
        // job list, held back here): set then, it once landed inside this fill
        const held = (r) => sleep(1500).then(() => r.continue());
        await page.route('**/v1/jobs?limit=*', held);
        await page.goto(`${base}/#/plan`);
        await page.waitForSelector('#plan-spec');
        assert.ok((await page.inputValue('#plan-spec')).startsWith('{'), 'the first example comes with the page');
        await page.unroute('**/v1/jobs?limit=*', held);
        await page.fill('#plan-spec', JSON.stringify(mspec));
        await page.click('#plan-compare');
        // the page's first example may have been planned already (also 1f1b): wait for this spec's dp column,
        // or an error (said, not a timeout)
        const failed = '#plan-error:not([hidden]), #plan-detail .banner.error';
        try {
          await page.waitForSelector(`#plan-detail [data-schedule="1f1b"] #plan-ranks .plan-dp, ${failed}`);
        } catch (e) { // say what the coordinator's pool of expensive requests was doing
          const m = await (await fetch(base + '/metrics', {headers: auth})).text();
          throw new Error(`${e.message}\n${m.split('\n').filter((l) => l.startsWith('pipewright_http_pool')).join('; ')}`);
        }
        assert.equal(await page.locator(failed).count(), 0, await page.locator(failed).allTextContents().then((t) => t.join('; ')));
        const fmtB = (x) => { let i = 0; const u = ['B', 'KiB', 'MiB']; while (x >= 1024 && i < 2) { x /= 1024; i++; }
                              return (i ? x.toFixed(1) : x.toFixed(0)) + ' ' + u[i]; };
        for (const [k, r] of plan.analytics.ranks.entries()) {
          assert.equal(await page.locator(`#plan-timeline g.lane[data-lane="${k}"] [data-kind="D"]`).count(), 1, `rank ${k}: a DP block`);
          for (const what of ['dp', 'tp']) {
            assert.ok((await page.textContent(`#plan-ranks tbody tr:nth-child(${k + 1}) .plan-${what}`))
              .startsWith(`${what} ${fmtB(r[what + '_bytes_per_step'])} \u00b7 `), `rank ${k} ${what}`);
          }
        }
        await shot('plan-mesh');
      } finally {
        assert.equal((await api(`/v1/jobs/${tid}`, {method: 'DELETE'})).status, 200);
      }
      assert.deepEqual(pageErrors, [], 'no uncaught errors in the page');
    });
  } finally {
    await ctx.close().catch(() => {});
  }

  // Every daemon stops cleanly (a crash on any request the dashboard made would show here).
  for (const r of procs.slice(1)) await stop(r);
  const ex = await stop(coord);
  assert.deepEqual(ex, {code: 0, sig: null}, `coordinator exit:\n${logTail('coordinator')}`);
  fs.rmSync(tmp, {recursive: true, force: true});
});

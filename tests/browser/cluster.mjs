// cluster.mjs: a real coordinator and real workers on loopback for the
// browser scripts (ephemeral ports, a temporary state dir, --ready-file),
// and the small waits they need. Every process is killed when node exits.
import {spawn} from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

export async function waitFor(what, fn, ms) {
  const t0 = Date.now();
  let last;
  while (Date.now() - t0 < ms) {
    try {
      const v = await fn();
      if (v) return v;
    } catch (e) { last = e; }
    await sleep(100);
  }
  throw new Error(`timed out after ${ms} ms waiting for ${what}${last ? ': ' + last.message : ''}`);
}

// A process started as {p, exited}: SIGTERM, then SIGKILL after ms.
export async function stop(rec, ms = 10000) {
  if (rec.exited) return rec.exited;
  rec.p.kill('SIGTERM');
  const t0 = Date.now();
  while (!rec.exited && Date.now() - t0 < ms) await sleep(50);
  if (!rec.exited) {
    rec.p.kill('SIGKILL');
    while (!rec.exited) await sleep(20);
    return {code: null, sig: 'SIGKILL (did not stop on SIGTERM)'};
  }
  return rec.exited;
}

// new Cluster({build, source, out}): logs go to out/NAME.log.
export class Cluster {
  constructor({build, source, out}) {
    Object.assign(this, {build, source, out, procs: []});
    this.tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'pw-browser-'));
    process.on('exit', () => { for (const r of this.procs) if (!r.exited) r.p.kill('SIGKILL'); });
  }

  start(name, bin, args) {
    const log = fs.openSync(path.join(this.out, `${name}.log`), 'w');
    const p = spawn(path.join(this.build, bin), args, {cwd: this.source, stdio: ['ignore', log, log],
      env: {...process.env, OPENBLAS_NUM_THREADS: '1'}});
    fs.closeSync(log);
    const rec = {name, p, exited: null};
    p.on('exit', (code, sig) => { rec.exited = {code, sig}; });
    this.procs.push(rec);
    return rec;
  }

  logTail(name, n = 30) {
    try {
      return fs.readFileSync(path.join(this.out, `${name}.log`), 'utf8').split('\n').slice(-n).join('\n');
    } catch { return '(no log)'; }
  }

  // The coordinator (with --token-file when token is given); sets this.base and this.api.
  async coordinator({token = null, slow = 1} = {}) {
    const ready = path.join(this.tmp, 'ready.json');
    const args = ['--http', '127.0.0.1:0', '--control', '127.0.0.1:0', '--state-dir', path.join(this.tmp, 'coordinator'),
      '--web', path.join(this.source, 'web'), '--ready-file', ready, '--data-root', this.source];
    if (token) {
      const tf = path.join(this.tmp, 'api.token');
      fs.writeFileSync(tf, token + '\n', {mode: 0o600});
      args.push('--token-file', tf);
    }
    const coord = this.start('coordinator', 'pipewright-coordinator', args);
    this.ports = await waitFor('the coordinator\'s ready file', () => {
      if (coord.exited) throw new Error(`coordinator exited ${JSON.stringify(coord.exited)}:\n${this.logTail('coordinator')}`);
      return fs.existsSync(ready) && JSON.parse(fs.readFileSync(ready, 'utf8'));
    }, 20000 * slow);
    this.base = `http://127.0.0.1:${this.ports.http}`;
    const auth = token ? {Authorization: `Bearer ${token}`} : {};
    this.api = async (p, init = {}) => {
      const r = await fetch(this.base + p, {...init, headers: {...auth, ...(init.headers || {})}});
      const body = await r.text();
      return {status: r.status, json: body ? JSON.parse(body) : null};
    };
    return coord;
  }

  // n workers named prefix0.., waiting until all are idle.
  async workers(n, prefix, slow = 1) {
    for (let i = 0; i < n; i++) {
      this.start(`${prefix}${i}`, 'pipewright-worker', ['--coordinator', `127.0.0.1:${this.ports.control}`,
        '--listen', '127.0.0.1:0', '--name', `${prefix}${i}`, '--state-dir', path.join(this.tmp, `${prefix}${i}`)]);
    }
    await waitFor(`${n} idle workers`, async () => {
      const r = await this.api('/v1/workers');
      return r.json.workers.filter((w) => w.state === 'idle').length >= n;
    }, 20000 * slow);
  }

  async submit(spec) {
    const r = await this.api('/v1/jobs', {method: 'POST', headers: {'Content-Type': 'application/json'},
                                          body: JSON.stringify(spec)});
    if (r.status !== 201) throw new Error(`submit ${spec.name}: ${r.status} ${JSON.stringify(r.json)}`);
    return r.json.id;
  }

  async state(id) { return (await this.api(`/v1/jobs/${id}`)).json.state; }

  stop(rec, ms) { return stop(rec, ms); }

  async stopAll() { for (const r of [...this.procs].reverse()) await this.stop(r); }
}

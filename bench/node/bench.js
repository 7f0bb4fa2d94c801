// BullMQ (Node.js) side of the benchmark, driven by adapters/peer_bullmq_node.py.
// Usage: node bench.js MODE URL [args...]; prints one JSON line (client modes).
'use strict';
const { Queue, Worker, QueueEvents } = require('bullmq');

const Q = process.env.BENCH_QUEUE || 'bench';  // W5 switches queues
const [mode, url, ...rest] = process.argv.slice(2);
const u = new URL(url);
const connection = { host: u.hostname, port: Number(u.port), db: Number((u.pathname || '/0').slice(1) || 0) };
const RESULT_TTL_MS = 30000;

function pct(sorted, p) {
  if (!sorted.length) return NaN;
  const k = (sorted.length - 1) * p / 100, lo = Math.floor(k), hi = Math.min(lo + 1, sorted.length - 1);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (k - lo);
}
const now = () => Number(process.hrtime.bigint()) / 1e9;

async function main() {
  if (mode === 'worker') {
    const worker = new Worker(Q, async (job) => ({ ok: true, i: job.data }), { connection, concurrency: Number(rest[0]) });
    const stop = async () => { await worker.close(); process.exit(0); };
    process.on('SIGTERM', stop); process.on('SIGINT', stop);
    return;
  }
  if (mode === 'events') {
    const ev = new QueueEvents(Q, { connection });
    const stop = async () => { await ev.close(); process.exit(0); };
    process.on('SIGTERM', stop); process.on('SIGINT', stop);
    return;
  }
  if (mode === 'flow') {  // a fan-out of N children under one parent, then the fan-in
    const { FlowProducer } = require('bullmq');
    const n = Number(rest[0]); const q = `fan-${process.pid}`;
    const flow = new FlowProducer({ connection });
    let t0 = now();
    const tree = await flow.add({ name: 'parent', queueName: q,
      children: Array.from({ length: n }, (_, i) => ({ name: 'child', queueName: q, data: i })) });
    const added = now() - t0;
    t0 = now();
    const done = new Promise((resolve, reject) => {
      const worker = new Worker(q, async (job) => {
        if (job.name !== 'parent') return job.data;
        const values = await job.getChildrenValues();
        const count = Object.keys(values).length;
        setImmediate(() => worker.close().then(() => resolve(count)));
        return count;
      }, { connection, concurrency: 8 });
      worker.on('error', reject);
    });
    const count = await done;
    const ran = now() - t0;
    if (count !== n) throw new Error(`parent saw ${count} children, not ${n}`);
    await flow.close();
    process.stdout.write(JSON.stringify({ id: tree.job.id, add_s: added, fanin_s: ran }) + '\n',
      () => process.exit(0));
    return;
  }
  const queue = new Queue(Q, { connection });
  let out = {};
  if (mode === 'add') {
    const job = await queue.add('noop', Number(rest[0]));
    out = { id: job.id };
  } else if (mode === 'preload') {
    const n = Number(rest[0]); const ids = [];
    for (let s = 0; s < n; s += 1000) {
      const jobs = await queue.addBulk(Array.from({ length: Math.min(1000, n - s) }, (_, k) => ({ name: 'noop', data: s + k })));
      for (const j of jobs) ids.push(j.id);
    }
    out = { ids };
  } else if (mode === 'adds') {  // n single adds, nothing timed (bench/server_cost.py)
    const n = Number(rest[0]);
    for (let i = 0; i < n; i++) await queue.add('noop', i);
  } else if (mode === 'bulk') {  // n jobs in bulk adds of 1,000, nothing timed
    const n = Number(rest[0]);
    for (let s = 0; s < n; s += 1000) {
      await queue.addBulk(Array.from({ length: Math.min(1000, n - s) }, (_, k) => ({ name: 'noop', data: s + k })));
    }
  } else if (mode === 'load') {  // W5's backlog: addBulk of 1,000 at a time, no ids kept
    const n = Number(rest[0]);
    for (let s = 0; s < n; s += 1000) {
      await queue.addBulk(Array.from({ length: Math.min(1000, n - s) }, (_, k) => ({ name: 'noop', data: s + k })));
    }
    out = { loaded: n };
  } else if (mode === 'pair') {  // W5: adds alternating between two queues (see _common.pair_rates)
    const [kind, n, chunk, qa, qb] = [rest[0], Number(rest[1]), Number(rest[2]), rest[3], rest[4]];
    const IORedis = require('ioredis'); const r = new IORedis(connection);
    const usec = async () => {  // server µs in scripts so far (INFO commandstats)
      const text = await r.info('commandstats'); let total = 0;
      for (const c of ['evalsha', 'eval', 'fcall', 'fcall_ro']) {
        const m = text.match(new RegExp(`cmdstat_${c}:calls=\\d+,usec=(\\d+)`));
        if (m) total += Number(m[1]);
      }
      return total;
    };
    const queues = [new Queue(qa, { connection }), new Queue(qb, { connection })];
    const spent = [0, 0], us = [0, 0];
    for (let c = 0, start = 0; start < n; c++, start += chunk) {
      const count = Math.min(chunk, n - start);
      for (const side of (c % 2 === 0 ? [0, 1] : [1, 0])) {
        const q = queues[side]; const u0 = await usec(); const t0 = now();
        if (kind === 'single') {
          for (let i = start; i < start + count; i++) await q.add('noop', i);
        } else {
          for (let s = start; s < start + count; s += 1000) {
            await q.addBulk(Array.from({ length: Math.min(1000, start + count - s) }, (_, k) => ({ name: 'noop', data: s + k })));
          }
        }
        spent[side] += now() - t0; us[side] += (await usec()) - u0;
      }
    }
    for (const q of queues) await q.close();
    r.disconnect();
    out = { a_jobs_s: n / spent[0], b_jobs_s: n / spent[1], a_server_us: us[0] / n, b_server_us: us[1] / n };
  } else if (mode === 'w1') {
    const n = Number(rest[0]);
    let t0 = now();
    for (let i = 0; i < n; i++) await queue.add('noop', i);
    out.w1_single_jobs_s = n / (now() - t0);
    { const IORedis = require('ioredis'); const r = new IORedis(connection); await r.flushdb(); r.disconnect(); }
    t0 = now();
    for (let s = 0; s < n; s += 1000) {
      await queue.addBulk(Array.from({ length: Math.min(1000, n - s) }, (_, k) => ({ name: 'noop', data: s + k })));
    }
    out.w1_bulk_jobs_s = n / (now() - t0);
  } else if (mode === 'rr') {
    const [w3n, w3max, w4secs, w4callers] = rest.map(Number);
    const ev = new QueueEvents(Q, { connection });
    await ev.waitUntilReady();
    await new Promise((r) => setTimeout(r, 200));
    const trip = async (i) => {
      const t0 = now();
      const job = await queue.add('noop', i);
      const res = await job.waitUntilFinished(ev, RESULT_TTL_MS);
      const dt = now() - t0;
      if (!res || res.i !== i) throw new Error(`wrong result ${JSON.stringify(res)} for ${i}`);
      return dt;
    };
    for (let i = 0; i < 20; i++) await trip(-1 - i);  // warm-up, as the Python harness does
    const w3 = []; const deadline = now() + w3max;
    for (let i = 0; i < w3n; i++) {
      w3.push(await trip(i) * 1000);
      if (now() > deadline) { out.w3_capped = `stopped after ${w3.length} trips`; break; }
    }
    w3.sort((a, b) => a - b);
    Object.assign(out, { w3_n: w3.length, w3_p50_ms: pct(w3, 50), w3_p95_ms: pct(w3, 95), w3_p99_ms: pct(w3, 99),
      w3_mean_ms: w3.reduce((a, b) => a + b, 0) / w3.length });
    const w4 = []; const stopAt = now() + w4secs; const t0 = now();
    await Promise.all(Array.from({ length: w4callers }, async (_, t) => {
      let j = 1000000 * (t + 1);
      while (now() < stopAt) w4.push(await trip(j++) * 1000);
    }));
    const el = now() - t0;
    w4.sort((a, b) => a - b);
    Object.assign(out, { w4_trips_s: w4.length / el, w4_p50_ms: pct(w4, 50), w4_p99_ms: pct(w4, 99) });
    await ev.close();
  } else {
    throw new Error(`unknown mode ${mode}`);
  }
  await queue.close();
  // a pipe's write is asynchronous: exit only once the whole line is flushed
  process.stdout.write(JSON.stringify(out) + '\n', () => process.exit(0));
}

main().catch((err) => { console.log(JSON.stringify({ error: String(err && err.stack || err) })); process.exit(1); });

// BullMQ side of scripts/bench-peers.sh.
//   node bullmq.mjs produce <redis port> <queue> <jobs>      (the queue is left paused)
//   node bullmq.mjs resume <redis port> <queue> <workers>    (once that many workers are connected)
//   node bullmq.mjs work <redis port> <queue> <upstream URL> <concurrency> <max per second, 0: none>
// A worker POSTs each job's body to <upstream URL> with the job id as Idempotency-Key (as a
// Sluice worker does) and runs until it is killed. With a max, it uses BullMQ's own limiter
// ({max, duration: 1000}), which the limiter shares among all workers of the queue.
import { Queue, Worker } from "bullmq";
import IORedis from "ioredis";
import http from "node:http";

const [mode, port, name, ...rest] = process.argv.slice(2);
// BullMQ 6 takes a client instance in ESM; workers need maxRetriesPerRequest: null.
const connection = new IORedis({ host: "127.0.0.1", port: Number(port), maxRetriesPerRequest: null });

if (mode === "produce") {
  const n = Number(rest[0]);
  const q = new Queue(name, { connection });
  for (let i = 0; i < n; i += 1000) {
    const batch = [];
    if (i === 0) await q.pause(); // nothing is taken before every worker is there
    for (let j = i; j < Math.min(n, i + 1000); j++) {
      batch.push({ name: "job", data: { body: `job-${j}` }, opts: { removeOnComplete: true, removeOnFail: true } });
    }
    await q.addBulk(batch);
  }
  await q.pause();
  await q.close();
  process.exit(0);
}

if (mode === "resume") {
  const q = new Queue(name, { connection });
  while ((await q.getWorkers()).length < Number(rest[0])) await new Promise((r) => setTimeout(r, 50));
  await q.resume();
  await q.close();
  process.exit(0);
}

const [upstream, concurrency, max] = rest;
const agent = new http.Agent({ keepAlive: true, maxSockets: Number(concurrency) });
const target = new URL(upstream);
function post(id, body) {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: target.hostname, port: target.port, path: target.pathname, method: "POST", agent,
      headers: { "Idempotency-Key": id, "Content-Type": "text/plain", "Content-Length": Buffer.byteLength(body) } }, (res) => {
      res.resume();
      res.on("end", () => (res.statusCode < 300 ? resolve() : reject(new Error(`status ${res.statusCode}`))));
    });
    req.on("error", reject);
    req.end(body);
  });
}
const opts = { connection, concurrency: Number(concurrency) };
if (Number(max) > 0) opts.limiter = { max: Number(max), duration: 1000 };
new Worker(name, async (job) => post(String(job.id), job.data.body), opts);

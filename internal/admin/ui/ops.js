// The operating views of the dashboard: the history of every queue as the server sampled it
// (GET /v1/history, drawn at once on load), health (GET /v1/health), per-queue rate and
// pause-for controls, and the job browser (GET /v1/queues/{q}/jobs). Uses api, el, write and
// say from app.js.
"use strict";

// The span the charts show, in ms: the range chosen, or (by default) what the history covers,
// at least a minute, so a young deployment's drain is not a spike at the right edge.
function spanOf(pts) {
  const chosen = document.getElementById("range").value;
  if (chosen !== "fit") return Number(chosen) * 1000;
  const covered = pts.length ? Date.parse(pts[pts.length - 1].t) - Date.parse(pts[0].t) : 0;
  return Math.max(60 * 1000, covered * 1.05);
}

// label writes v in unit for people: rates and counts with num, times in ms as ms, s or min.
function label(v, unit) {
  if (unit === "ms") return v >= 60000 ? num(v / 60000) + " min" : v >= 1000 ? num(v / 1000) + " s" : num(v) + " ms";
  if (unit === "%") return num(v) + "%";
  if (unit === "/s") return num(v) + "/s";
  return num(v);
}

// chart draws series over the points pts on canvas c, with axes and a legend. series:
// [{key, label, color, width}]; a point's value is p[key] (null leaves a gap). Intervals
// sampled paused are shaded; where the allowed rate changed, a dashed line.
function chart(c, pts, series, unit) {
  const g = c.getContext("2d");
  const W = c.width, H = c.height, L = 52, R = 8, T = 18, B = 20;
  g.clearRect(0, 0, W, H);
  const span = spanOf(pts);
  c.dataset.span = span / 1000;
  const end = pts.length ? Date.parse(pts[pts.length - 1].t) : Date.now();
  const shown = pts.filter(p => end - Date.parse(p.t) <= span);
  let top = 0;
  for (const p of shown) for (const s of series) if (p[s.key] != null) top = Math.max(top, p[s.key]);
  g.font = "10px system-ui"; g.lineWidth = 1;
  c.dataset.empty = top > 0 ? "" : "1";
  if (!shown.some(p => series.some(s => p[s.key] != null))) {
    g.fillStyle = "#667";
    g.fillText("no data yet", W / 2 - 25, H / 2);
    return;
  }
  const flat = top === 0; // all zero: one tick, no fractions of nothing
  top = top > 0 ? top * 1.15 : 1;
  const x = t => L + (W - L - R) * (1 - (end - t) / span);
  const y = v => H - B - (H - T - B) * v / top;
  // Paused intervals, then rate changes, under the lines.
  g.fillStyle = "rgba(178, 80, 0, 0.12)";
  for (let i = 1; i < shown.length; i++) {
    if (shown[i].paused) g.fillRect(x(Date.parse(shown[i - 1].t)), T, x(Date.parse(shown[i].t)) - x(Date.parse(shown[i - 1].t)), H - T - B);
  }
  g.strokeStyle = "#888"; g.setLineDash([3, 3]);
  for (let i = 1; i < shown.length; i++) {
    const a = shown[i - 1], b = shown[i];
    if (a.paused || b.paused || a.allowed == null || b.allowed == null) continue;
    if (Math.abs(b.allowed - a.allowed) > 0.05 * Math.max(a.allowed, b.allowed)) {
      const xt = x(Date.parse(b.t));
      g.beginPath(); g.moveTo(xt, T); g.lineTo(xt, H - B); g.stroke();
    }
  }
  g.setLineDash([]);
  g.strokeStyle = "#ccd"; g.fillStyle = "#667";
  g.beginPath(); g.moveTo(L, T); g.lineTo(L, H - B); g.lineTo(W - R, H - B); g.stroke();
  for (const f of flat ? [0] : [0, 0.5, 1]) {
    const v = top / 1.15 * f;
    g.fillText(label(v, unit), 2, y(v) + 3);
  }
  // Time ticks: the first step of these that gives at most six.
  const step = [15, 30, 60, 300, 900, 1800].find(s => span / 1000 / s <= 6) || 3600;
  for (let s = 0; s * 1000 <= span; s += step) {
    const text = s === 0 ? "now" : s < 60 ? "-" + s + "s" : "-" + s / 60 + "m";
    g.fillText(text, x(end - s * 1000) - (s ? 10 : 18), H - 6);
  }
  let lx = L + 4;
  for (const s of series) {
    g.fillStyle = s.color; g.fillRect(lx, 4, 10, 3); g.fillStyle = "#334";
    g.fillText(s.label, lx + 13, 10); lx += 18 + g.measureText(s.label).width;
    g.strokeStyle = s.color; g.lineWidth = s.width || 1.5; g.beginPath();
    let pen = false;
    for (const p of shown) {
      const t = Date.parse(p.t);
      if (p[s.key] == null) { pen = false; continue; }
      pen ? g.lineTo(x(t), y(p[s.key])) : g.moveTo(x(t), y(p[s.key]));
      pen = true;
    }
    g.stroke();
    // A point without a neighbour draws no line: mark it.
    g.fillStyle = s.color;
    shown.forEach((p, i) => {
      const alone = (i === 0 || shown[i - 1][s.key] == null) && (i === shown.length - 1 || shown[i + 1][s.key] == null);
      if (p[s.key] != null && alone) g.fillRect(x(Date.parse(p.t)) - 2, y(p[s.key]) - 2, 4, 4);
    });
  }
}

function canvasIn(box, id, title) {
  let c = document.getElementById(id);
  if (!c) {
    const wrap = el("div", undefined, "chart");
    wrap.append(el("div", title));
    c = el("canvas");
    c.id = id; c.width = 440; c.height = 150;
    wrap.append(c);
    box.append(wrap);
  }
  return c;
}

async function renderHistory() {
  const data = await api("GET", "/v1/history");
  const box = document.getElementById("charts");
  for (const h of data.queues) {
    const rate = canvasIn(box, "chart-" + h.queue, h.queue + ": deliveries/s against the allowed rate");
    rate.dataset.points = h.points.length;
    rate.dataset.seconds = h.points.length ? (Date.parse(h.points[h.points.length - 1].t) - Date.parse(h.points[0].t)) / 1000 : 0;
    chart(rate, h.points, [{key: "allowed", label: "allowed", color: "#c8ccd4", width: 5},
      {key: "delivered", label: "delivered", color: "#1f6feb", width: 2}], "/s");
    chart(canvasIn(box, "backlog-" + h.queue, h.queue + ": backlog (jobs in the queue)"), h.points,
      [{key: "depth", label: "depth", color: "#b25000", width: 2}], "jobs");
    // The workers' figures of each interval (null: no attempt): shares in %, times in ms.
    const pct = v => v == null ? null : v * 100;
    const worker = h.points.map(p => ({t: p.t, paused: p.paused, allowed: p.allowed, r429: pct(p.r429_share),
      r5xx: pct(p.r5xx_share), p50: p.tiq_p50_ms, p99: p.tiq_p99_ms}));
    const answers = canvasIn(box, "answers-" + h.queue, h.queue + ": share of attempts answered 429 and 5xx");
    answers.dataset.points = worker.filter(p => p.r429 != null).length;
    chart(answers, worker, [{key: "r429", label: "429", color: "#8250df", width: 2},
      {key: "r5xx", label: "5xx", color: "#cf222e", width: 2}], "%");
    chart(canvasIn(box, "tiq-" + h.queue, h.queue + ": time in queue, acceptance to attempt"), worker,
      [{key: "p50", label: "p50", color: "#1a7f37", width: 2},
        {key: "p99", label: "p99", color: "#9a6700", width: 1.5}], "ms");
  }
  document.body.dataset.history = "1";
}

// queueControls adds a rate field and a pause-for field to a queue's actions cell.
function queueControls(q, cell) {
  const rate = el("input");
  rate.className = "rate"; rate.size = 6; rate.placeholder = q.runtime_rate || q.rate;
  const set = el("button", "set rate");
  set.title = "set the rate at run time (blank: back to the file's)";
  set.addEventListener("click", () => write("PATCH", "/v1/queues/" + encodeURIComponent(q.name),
    {rate: rate.value.trim() === "" ? null : rate.value.trim()}));
  const dur = el("input");
  dur.className = "pausefor"; dur.size = 4; dur.placeholder = "5m";
  const pf = el("button", "pause for");
  pf.addEventListener("click", () => write("POST", "/v1/queues/" + encodeURIComponent(q.name) +
    "/pause?for=" + encodeURIComponent(dur.value.trim() || "5m")));
  const group = (...parts) => { const g = el("span", undefined, "grp"); g.append(...parts); return g; };
  cell.append(group(rate, set), group(dur, pf));
}

async function renderHealth() {
  const h = await api("GET", "/v1/health");
  const box = document.getElementById("health");
  box.replaceChildren();
  const checks = el("div");
  for (const c of h.checks) {
    checks.append(el("span", c.name + " " + (c.ok ? "ok" : "down") + " " + c.latency_ms.toFixed(1) + " ms" +
      (c.error ? " (" + c.error + ")" : ""), c.ok ? "ok check" : "err check"));
  }
  box.append(checks);
  const wt = el("table");
  wt.id = "workers";
  wt.append(el("thead"));
  wt.tHead.append(el("tr"));
  for (const n of ["worker", "version", "queues", "last seen"]) wt.tHead.rows[0].append(el("th", n));
  const wb = el("tbody");
  for (const w of h.workers) {
    const tr = el("tr");
    tr.append(el("td", w.id), el("td", w.version || "-"), el("td", w.queues.join(", ")),
      el("td", duration(Math.max(0, (Date.now() - Date.parse(w.last_seen)) / 1000)) + " ago"));
    wb.append(tr);
  }
  if (!h.workers.length) {
    const tr = el("tr");
    tr.append(el("td", h.workers_error || "no worker process announced itself", "err"));
    wb.append(tr);
  }
  wt.append(wb);
  box.append(wt);
  const notes = el("ul");
  for (const q of h.queues) {
    if (q.paused) notes.append(el("li", q.name + ": paused " + (q.paused_until ? "until " + new Date(q.paused_until).toLocaleTimeString() : "until resumed"), "paused"));
    for (const [id, until] of Object.entries(q.paused_tenants || {})) notes.append(el("li", q.name + ": tenant " + id + " paused until " + new Date(until).toLocaleTimeString(), "paused"));
    if (q.tenant_overrides) notes.append(el("li", q.name + ": " + q.tenant_overrides + (q.tenant_overrides === 1 ? " tenant has" : " tenants have") + " settings of their own"));
  }
  box.append(notes);
}

// The job browser: a cursor per page, kept so that "previous" goes back.
const jb = {cursors: [0], page: 0};

async function renderJobs() {
  const q = document.getElementById("jobQueue").value || document.getElementById("dlqQueue").value;
  if (!q) return;
  const state = document.getElementById("jobState").value;
  const tenant = document.getElementById("jobTenant").value.trim();
  const limit = document.getElementById("jobLimit").value;
  const start = performance.now();
  const data = await api("GET", "/v1/queues/" + encodeURIComponent(q) + "/jobs?state=" + encodeURIComponent(state) +
    "&limit=" + limit + "&cursor=" + jb.cursors[jb.page] + (tenant ? "&tenant=" + encodeURIComponent(tenant) : ""));
  const body = document.querySelector("#jobs tbody");
  const rows = [];
  for (const j of data.jobs) {
    const tr = el("tr");
    tr.dataset.id = j.id;
    const open = el("a", j.id);
    open.href = "#"; open.addEventListener("click", e => { e.preventDefault(); showJob(q, j.id); });
    const id = el("td"); id.append(open);
    tr.append(id, el("td", j.state), el("td", j.attempts), el("td", j.response ? j.response.status : "-"),
      el("td", j.tenant || "-"), el("td", new Date(j.created_at).toLocaleString()), el("td", j.last_error || ""));
    tr.append(jobActions(q, j));
    rows.push(tr);
  }
  body.replaceChildren(...rows);
  jb.cursors[jb.page + 1] = data.next;
  document.getElementById("jobNext").disabled = !data.next;
  document.getElementById("jobPrev").disabled = jb.page === 0;
  const info = document.getElementById("jobInfo");
  info.textContent = "page " + (jb.page + 1) + ", " + data.jobs.length + " jobs (" + data.scanned + " read)";
  const table = document.getElementById("jobs");
  table.dataset.page = jb.page + 1;
  table.dataset.ms = (performance.now() - start).toFixed(1);
  table.dataset.first = data.jobs.length ? data.jobs[0].id : "";
}

function jobActions(q, j) {
  const td = el("td");
  if (j.state === "queued" || j.state === "retrying") {
    const b = el("button", "cancel");
    b.className = "cancel";
    b.addEventListener("click", () => write("DELETE", "/v1/jobs/" + encodeURIComponent(j.id)).then(renderJobs));
    td.append(b);
  }
  if (j.dead_letter) {
    const b = el("button", "replay");
    b.className = "replay";
    b.addEventListener("click", () => write("POST", "/v1/queues/" + encodeURIComponent(q) + "/dead-letters/replay", {ids: [j.id]}).then(renderJobs));
    td.append(b);
  }
  return td;
}

async function showJob(q, id) {
  const box = document.getElementById("jobDetail");
  try {
    const j = await api("GET", "/v1/jobs/" + encodeURIComponent(id));
    box.replaceChildren(el("pre", JSON.stringify(j, null, 2)), jobActions(q, j));
  } catch (e) {
    box.replaceChildren(el("div", e.message, "err"));
  }
}

function restartJobs() { jb.cursors = [0]; jb.page = 0; renderJobs().catch(e => say(e.message, true)); }
document.getElementById("jobState").addEventListener("change", restartJobs);
document.getElementById("jobQueue").addEventListener("change", restartJobs);
document.getElementById("jobTenant").addEventListener("change", restartJobs);
document.getElementById("jobLimit").addEventListener("change", restartJobs);
document.getElementById("jobNext").addEventListener("click", () => { jb.page++; renderJobs().catch(e => say(e.message, true)); });
document.getElementById("jobPrev").addEventListener("click", () => { if (jb.page > 0) jb.page--; renderJobs().catch(e => say(e.message, true)); });

function fillJobQueues(queues) {
  const s = document.getElementById("jobQueue");
  if (s.options.length === queues.length) return;
  const chosen = s.value;
  s.replaceChildren(...queues.map(q => { const o = el("option", q.name); o.value = q.name; return o; }));
  if (chosen) s.value = chosen;
}

async function refreshOps() {
  const fail = e => say("reading the admin API: " + e.message, true);
  try {
    fillJobQueues((await api("GET", "/v1/queues")).queues);
  } catch (e) {
    return fail(e);
  }
  const first = !document.getElementById("jobs").dataset.page;
  await Promise.all([renderHistory().catch(fail), renderHealth().catch(fail), first ? renderJobs().catch(fail) : null]);
}
document.getElementById("range").addEventListener("change", () => renderHistory().catch(e => say(e.message, true)));
refreshOps();
setInterval(refreshOps, 5000);

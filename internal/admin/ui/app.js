// The Sluice dashboard: reads the admin API every 2 s and sends operator writes with the token
// typed once. The charts, health and job browser are ops.js's.
"use strict";
const tokenInput = document.getElementById("token");
tokenInput.value = sessionStorage.getItem("sluice-token") || "";
tokenInput.addEventListener("change", () => sessionStorage.setItem("sluice-token", tokenInput.value));

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined) e.textContent = text;
  if (cls) e.className = cls;
  return e;
}

// Numbers for people: three significant digits at most, whole from 100 up.
function num(v) {
  if (v == null || !isFinite(v)) return "-";
  const a = Math.abs(v);
  if (a >= 1e6) return (v / 1e6).toPrecision(3).replace(/\.?0+$/, "") + "M";
  if (a >= 1e4) return (v / 1e3).toPrecision(3).replace(/\.?0+$/, "") + "k";
  if (a >= 100) return String(Math.round(v));
  return String(Number(v.toPrecision(3)));
}

// A span of seconds for people: "45 s", "3 min 20 s", "2 h 5 min", "3 d 4 h".
function duration(s) {
  if (s == null || !isFinite(s)) return "-";
  s = Math.round(s);
  if (s < 60) return s + " s";
  if (s < 3600) return Math.floor(s / 60) + " min" + (s % 60 ? " " + s % 60 + " s" : "");
  if (s < 86400) return Math.floor(s / 3600) + " h" + (s % 3600 >= 60 ? " " + Math.floor(s % 3600 / 60) + " min" : "");
  return Math.floor(s / 86400) + " d" + (s % 86400 >= 3600 ? " " + Math.floor(s % 86400 / 3600) + " h" : "");
}

// emptiesIn is when q's backlog is gone at its allowed rate if nothing more arrives.
function emptiesIn(q) {
  if (!q.depth) return "empty";
  if (q.paused) return "paused";
  if (!q.effective_rate) return "never at 0/s";
  return duration(q.depth / q.effective_rate);
}

async function api(method, path, body) {
  const headers = {};
  if (tokenInput.value) headers["Authorization"] = "Bearer " + tokenInput.value;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const send = () => fetch(path, {method, headers, body: body === undefined ? undefined : JSON.stringify(body)});
  let res = await send();
  // A read beyond the admin API's pace (the job browser's pages per second) waits its Retry-After.
  for (let i = 0; i < 3 && res.status === 429 && method === "GET"; i++) {
    const wait = Math.min(5, Number(res.headers.get("Retry-After")) || 1);
    await new Promise(r => setTimeout(r, wait * 1000));
    res = await send();
  }
  const data = await res.json().catch(() => ({}));
  if (!res.ok) throw new Error(res.status + " " + (data.title || "") + (data.detail ? ": " + data.detail : ""));
  return data;
}

function say(text, isError) {
  const s = document.getElementById("status");
  s.textContent = text;
  s.className = isError ? "err" : "muted";
}

async function write(method, path, body) {
  try {
    await api(method, path, body);
    say(method + " " + path + ": done");
  } catch (e) {
    say(e.message, true);
  }
  refresh();
}

// regionBadge is a global queue's (or, with rule set, a global rule's) lease of its region
// (GET /v1/regions), for its name cell: "a 25/s", or "a safe share 25/s" (highlighted) while
// the region holds no lease. A rule's figures are its limit per key, per second.
function regionBadge(regions, name, rule) {
  const q = ((rule ? regions.rules : regions.queues) || []).find(g => (rule ? g.rule : g.queue) === name);
  const l = q && q.leases.find(l => l.region === regions.region);
  if (!q) return null;
  const b = el("span", undefined, "region");
  if (!l) {
    b.textContent = regions.region + " ?";
    b.title = "the coordinator could not be read: " + (regions.coordinator || "");
    return b;
  }
  const left = l.expires ? (new Date(l.expires) - Date.now()) / 1000 : 0;
  b.textContent = regions.region + (l.on_safe_share ? " safe share " + num(q.safe_share) : " " + num(l.share)) + "/s";
  if (l.on_safe_share) b.classList.add(l.lost ? "lost" : "safe");
  b.title = "global budget " + num(q.budget) + "/s shared by " + regions.regions.join(", ") + "; region " + regions.region +
    (l.on_safe_share ? " holds no lease" + (l.lost ? " for longer than a lease" : "") + ": it runs on its safe share"
      : " holds " + num(l.share) + "/s for " + duration(left)) + "; demand " + num(l.demand) + "/s";
  return b;
}

function renderQueues(queues, regions) {
  const body = document.querySelector("#queues tbody");
  body.replaceChildren();
  const select = document.getElementById("dlqQueue");
  const chosen = select.value;
  select.replaceChildren();
  for (const q of queues) {
    const tr = el("tr");
    tr.dataset.queue = q.name;
    const name = el("td", q.name, "name");
    const badge = regionBadge(regions, q.name);
    if (badge) name.append(" ", badge);
    tr.append(name, el("td", q.runtime_rate ? q.runtime_rate + " (runtime)" : q.rate),
      el("td", num(q.effective_rate) + "/s", "allowed"), el("td", num(q.depth)), el("td", num(q.scheduled || 0), "scheduled"), el("td", num(q.in_flight)),
      el("td", q.delivering == null ? "-" : q.delivering + "/" + q.max_in_flight, "delivering"),
      el("td", num(q.dead_letters)), el("td", q.paused ? "paused" : "no", q.paused ? "paused" : ""),
      el("td", q.fair ? String(q.tenants || 0) + (q.paused_tenants ? " (" + q.paused_tenants + " paused)" : "") : "-", "tenants"),
      el("td", emptiesIn(q), "empties"));
    const actions = el("td", undefined, "actions");
    const pause = el("button", q.paused ? "resume" : "pause");
    pause.className = "toggle";
    pause.addEventListener("click", () =>
      write("POST", "/v1/queues/" + encodeURIComponent(q.name) + (q.paused ? "/resume" : "/pause")));
    actions.append(pause);
    queueControls(q, actions);
    tr.append(actions);
    body.append(tr);
    const opt = el("option", q.name);
    opt.value = q.name;
    select.append(opt);
  }
  if (chosen) select.value = chosen;
}

function renderRules(rules, regions) {
  const body = document.querySelector("#rules tbody");
  body.replaceChildren();
  for (const r of rules) {
    const d = r.decisions;
    const tr = el("tr");
    const name = el("td", r.name + (r.shadow ? " (shadow)" : ""), "name");
    const badge = regionBadge(regions, r.name, true);
    if (badge) name.append(" ", badge);
    tr.dataset.rule = r.name;
    tr.append(name,
      el("td", r.limit ? r.limit + " / " + r.period + " " + r.algorithm : r.action + " → " + r.queue));
    for (const o of ["allowed", "rejected", "enqueued", "shadow", "fail_open", "fail_closed"]) {
      tr.append(el("td", num(Math.round(d[o] || 0))));
    }
    body.append(tr);
  }
}

async function renderDeadLetters() {
  const q = document.getElementById("dlqQueue").value;
  const body = document.querySelector("#dlq tbody");
  if (!q) return;
  const data = await api("GET", "/v1/queues/" + encodeURIComponent(q) + "/dead-letters");
  body.replaceChildren();
  for (const d of data.dead_letters) {
    const tr = el("tr");
    tr.append(el("td", d.id), el("td", d.reason), el("td", d.attempts), el("td", d.last_status || "-"),
      el("td", new Date(d.time).toLocaleString()));
    body.append(tr);
  }
}

document.getElementById("replayAll").addEventListener("click", () => {
  const q = document.getElementById("dlqQueue").value;
  if (q) write("POST", "/v1/queues/" + encodeURIComponent(q) + "/dead-letters/replay");
});
document.getElementById("purgeAll").addEventListener("click", () => {
  const q = document.getElementById("dlqQueue").value;
  if (q && confirm("Delete every dead letter of " + q + "?")) write("DELETE", "/v1/queues/" + encodeURIComponent(q) + "/dead-letters");
});
document.getElementById("dlqQueue").addEventListener("change", renderDeadLetters);

async function refresh() {
  try {
    const [qs, rs, regions] = await Promise.all([api("GET", "/v1/queues"), api("GET", "/v1/rules"),
      api("GET", "/v1/regions").catch(() => ({queues: []}))]);
    renderQueues(qs.queues, regions);
    renderRules(rs.rules, regions);
    await renderDeadLetters();
    document.body.dataset.loaded = "1";
  } catch (e) {
    say("reading the admin API: " + e.message, true);
  }
}
refresh();
setInterval(refresh, 2000);

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

function renderQueues(queues) {
  const body = document.querySelector("#queues tbody");
  body.replaceChildren();
  const select = document.getElementById("dlqQueue");
  const chosen = select.value;
  select.replaceChildren();
  for (const q of queues) {
    const tr = el("tr");
    tr.dataset.queue = q.name;
    tr.append(el("td", q.name), el("td", q.runtime_rate ? q.runtime_rate + " (runtime)" : q.rate),
      el("td", q.effective_rate.toFixed(2) + "/s"), el("td", q.depth), el("td", q.scheduled || 0, "scheduled"), el("td", q.in_flight),
      el("td", q.delivering == null ? "-" : q.delivering + "/" + q.max_in_flight, "delivering"),
      el("td", q.dead_letters), el("td", q.paused ? "paused" : "no", q.paused ? "paused" : ""),
      el("td", q.fair ? String(q.tenants || 0) + (q.paused_tenants ? " (" + q.paused_tenants + " paused)" : "") : "-", "tenants"));
    const actions = el("td");
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

function renderRules(rules) {
  const body = document.querySelector("#rules tbody");
  body.replaceChildren();
  for (const r of rules) {
    const d = r.decisions;
    const tr = el("tr");
    tr.append(el("td", r.name + (r.shadow ? " (shadow)" : "")),
      el("td", r.limit ? r.limit + " / " + r.period + " " + r.algorithm : r.action + " → " + r.queue));
    for (const o of ["allowed", "rejected", "enqueued", "shadow", "fail_open", "fail_closed"]) {
      tr.append(el("td", Math.round(d[o] || 0)));
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
    const [qs, rs] = await Promise.all([api("GET", "/v1/queues"), api("GET", "/v1/rules")]);
    renderQueues(qs.queues);
    renderRules(rs.rules);
    await renderDeadLetters();
    document.body.dataset.loaded = "1";
  } catch (e) {
    say("reading the admin API: " + e.message, true);
  }
}
refresh();
setInterval(refresh, 2000);

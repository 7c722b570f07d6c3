// joulegate console: polls the gateway's JSON endpoints (and /metrics) with
// the key typed in, and draws what they say. No library, no other origin.
"use strict";

const POLL_MS = 2000;
const KEY = "joulegate-key";
const powerHistory = [];  // [time ms, watts, idle watts]
let timer = null;
let firstRender = true;

function $(id) { return document.getElementById(id); }

function key() {
  const m = location.hash.match(/key=([^&]+)/);
  if (m) {  // from the URL fragment (never sent to the server); then out of the URL
    sessionStorage.setItem(KEY, decodeURIComponent(m[1]));
    history.replaceState(null, "", location.pathname);
  }
  return sessionStorage.getItem(KEY);
}

async function get(path, asText) {
  const k = key();
  const headers = k ? { authorization: "Bearer " + k } : {};
  const r = await fetch(path, { headers: headers, cache: "no-store" });
  if (!r.ok) {
    const err = new Error(path + ": " + r.status);
    err.status = r.status;
    throw err;
  }
  return asText ? r.text() : r.json();
}

function set(id, value, text) {
  const el = $(id);
  el.dataset.value = String(value);
  el.textContent = text === undefined ? String(value) : text;
}

function fmtJ(j) {
  if (j === null || j === undefined) return "-";
  if (Math.abs(j) >= 1000) return (j / 1000).toFixed(2) + " kJ";
  return j.toFixed(j < 1 ? 4 : 2) + " J";
}

function cell(tr, text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  tr.appendChild(td);
}

function metric(text, name) {
  // every sample of `name`: [{labels}, value]
  const out = [];
  const re = new RegExp("^" + name + "(?:\\{([^}]*)\\})? ([-+0-9.eE]+|NaN)$", "gm");
  let m;
  while ((m = re.exec(text)) !== null) {
    const labels = {};
    (m[1] || "").replace(/(\w+)="([^"]*)"/g, (_, k, v) => { labels[k] = v; return ""; });
    out.push([labels, parseFloat(m[2])]);
  }
  return out;
}

function drawPower() {
  const c = $("power-chart");
  const g = c.getContext("2d");
  g.clearRect(0, 0, c.width, c.height);
  if (powerHistory.length < 2) return;
  const max = Math.max(1, ...powerHistory.map((p) => Math.max(p[1], p[2] || 0))) * 1.1;
  const t0 = powerHistory[0][0];
  const span = Math.max(1, powerHistory[powerHistory.length - 1][0] - t0);
  const x = (t) => 30 + ((t - t0) / span) * (c.width - 40);
  const y = (w) => c.height - 15 - (w / max) * (c.height - 25);
  g.strokeStyle = "#b0b7bf"; g.setLineDash([4, 3]); g.beginPath();
  powerHistory.forEach((p, i) => { if (p[2] !== null) (i ? g.lineTo : g.moveTo).call(g, x(p[0]), y(p[2])); });
  g.stroke(); g.setLineDash([]);
  g.strokeStyle = "#2f7d6d"; g.lineWidth = 2; g.beginPath();
  powerHistory.forEach((p, i) => (i ? g.lineTo : g.moveTo).call(g, x(p[0]), y(p[1])));
  g.stroke();
  g.fillStyle = "#6a737d"; g.font = "11px system-ui";
  g.fillText(max.toFixed(0) + " W", 2, 12); g.fillText("0", 2, c.height - 15);
}

function renderPower(text) {
  const power = metric(text, "joulegate_device_power_watts");
  const idle = metric(text, "joulegate_device_idle_power_watts");
  const box = $("power");
  box.replaceChildren();
  if (!power.length) {
    const p = document.createElement("p");
    p.className = "muted";
    p.textContent = "Devices are metered by the agent: its /metrics and Prometheus have their power.";
    box.appendChild(p);
    return;
  }
  let total = 0, idleTotal = 0, haveIdle = false;
  power.forEach(([labels, w]) => {
    const i = idle.find(([l]) => l.device === labels.device);
    total += w;
    if (i) { idleTotal += i[1]; haveIdle = true; }
    const card = document.createElement("div");
    card.className = "card";
    card.innerHTML = '<div class="label"></div><div class="value"></div>';
    card.firstChild.textContent = labels.device + " (" + labels.source + ")";
    card.lastChild.textContent = w.toFixed(1) + " W" + (i ? " / idle " + i[1].toFixed(1) + " W" : "");
    card.lastChild.dataset.device = labels.device;
    card.lastChild.dataset.value = String(w);
    box.appendChild(card);
  });
  powerHistory.push([Date.now(), total, haveIdle ? idleTotal : null]);
  while (powerHistory.length > 150) powerHistory.shift();
  drawPower();
}

function renderUsage(u) {
  const t = u.totals || {};
  const who = u.key ? (u.key.admin ? "all keys (admin)" : "key " + u.key.name) : "open gateway";
  $("scope").textContent = "- " + who;
  set("t-requests", t.requests || 0);
  set("t-joules", t.energy_net_j || 0, fmtJ(t.energy_net_j || 0));
  const jpr = t.requests ? (t.energy_net_j || 0) / t.requests : 0;
  set("t-jpr", jpr, t.requests ? fmtJ(jpr) : "-");
  const saved = t.saved_expected_j || 0;
  set("t-saved", saved, fmtJ(saved) + (t.energy_net_j ? " (" + (100 * saved / (saved + t.energy_net_j)).toFixed(0) + "%)" : ""));
  if (u.key && u.key.joule_budget) {
    $("budget-card").hidden = false;
    const left = Math.max(0, u.key.joule_budget - u.key.spent_j);
    set("t-budget", left, fmtJ(left) + " of " + fmtJ(u.key.joule_budget) + " / " + u.key.budget_period);
  }
  const rows = u.data || [];
  const tiers = {};
  rows.forEach((r) => { tiers[r.tier] = (tiers[r.tier] || 0) + 1; });
  const split = $("split");
  split.replaceChildren();
  Object.keys(tiers).sort().forEach((tier) => {
    const bar = document.createElement("div");
    bar.className = "bar";
    const share = tiers[tier] / rows.length;
    bar.innerHTML = '<span class="name"></span><span class="fill"></span><span class="pct"></span>';
    bar.children[0].textContent = tier;
    bar.children[1].style.width = Math.round(share * 300) + "px";
    bar.children[2].textContent = tiers[tier] + " (" + (100 * share).toFixed(0) + "%)";
    bar.dataset.tier = tier;
    bar.dataset.value = String(tiers[tier]);
    split.appendChild(bar);
  });
  const body = $("rows");
  body.replaceChildren();
  rows.slice(-25).reverse().forEach((r) => {
    const tr = document.createElement("tr");
    tr.dataset.requestId = r.request_id || "";
    cell(tr, new Date(r.time * 1000).toLocaleTimeString());
    cell(tr, r.key_name || "-");
    cell(tr, r.model || r.route); cell(tr, r.tier); cell(tr, r.backend); cell(tr, r.strategy);
    cell(tr, r.category); cell(tr, r.status);
    cell(tr, r.prompt_tokens + " / " + r.completion_tokens, "num");
    cell(tr, fmtJ(r.energy_net_j), "num");
    tr.lastChild.dataset.value = String(r.energy_net_j);
    cell(tr, r.source + (r.energy_final ? "" : " (provisional)"));
    cell(tr, r.saved_j === null || r.saved_j === undefined ? "-" : fmtJ(r.saved_j), "num");
    body.appendChild(tr);
  });
}

function renderReport(rep) {
  const body = $("report");
  body.replaceChildren();
  const cats = Object.entries(rep.by_category || {});
  cats.forEach(([name, c]) => {
    const tr = document.createElement("tr");
    cell(tr, name); cell(tr, String(c.requests), "num");
    cell(tr, String(c.completion_tokens), "num"); cell(tr, fmtJ(c.energy_gross_j), "num");
    cell(tr, c.joules_per_answer_token === null ? "-" : c.joules_per_answer_token.toFixed(5), "num");
    cell(tr, String(c.loop_stops), "num");
    body.appendChild(tr);
  });
  $("report-box").hidden = !cats.length;
}

async function poll() {
  try {
    const [usage, metricsText] = await Promise.all([get("/v1/usage?since=1h"), get("/metrics", true)]);
    renderPower(metricsText);
    renderUsage(usage);
    const own = metric(metricsText, "joulegate_own_energy_joules_total").reduce((a, [, v]) => a + v, 0);
    set("t-own", own, fmtJ(own));
    $("keyform").hidden = true;
    $("forget").hidden = !key();
    $("status").textContent = "live, every " + POLL_MS / 1000 + " s";
    get("/v1/report?since=24h").then(renderReport, () => { $("report-box").hidden = true; });
    if (firstRender) {
      firstRender = false;
      document.body.dataset.renderedMs = String(Math.round(performance.now()));
    }
  } catch (e) {
    if (e.status === 401 || e.status === 403) {
      $("keyform").hidden = false;
      $("status").textContent = key() ? "that key was refused" : "an API key is needed";
    } else {
      $("status").textContent = "cannot reach the gateway (" + e.message + ")";
    }
  }
  timer = setTimeout(poll, POLL_MS);
}

document.addEventListener("DOMContentLoaded", () => {
  $("keyform").addEventListener("submit", (ev) => {
    ev.preventDefault();
    sessionStorage.setItem(KEY, $("key").value.trim());
    $("key").value = "";
    clearTimeout(timer);
    poll();
  });
  $("forget").addEventListener("click", () => {
    sessionStorage.removeItem(KEY);
    location.reload();
  });
  poll();
});

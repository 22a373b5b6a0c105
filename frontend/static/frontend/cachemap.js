// The cache map page: one page of engines x hottest prefixes, refreshed row by row on live deltas.
import { api, el, fmtBytes } from "./api.js";
import { onLive } from "./live.js";

const table = document.getElementById("cmap");
const detail = document.getElementById("cell-detail");
const vram = document.getElementById("vram");
const state = { offset: 0, limit: Number(table.dataset.pageSize), prefixes: Number(table.dataset.prefixes),
                data: null, engines: new Map(), states: {} };

function stat(name, value) {
  const node = document.querySelector(`[data-stat="${name}"]`);
  if (node) node.textContent = value;
}

function prefixLabel(p) {
  const tenant = p.tenant.length > 16 ? `${p.tenant.slice(0, 15)}…` : p.tenant;
  return `${tenant} · ${p.group.slice(0, 6)}`;
}

function cellTitle(engine, p, col) {
  const code = engine.cells[col];
  const depth = engine.depths[col];
  const tier = engine.tiers[col] === "-" ? "" : ` (${{ G: "GPU", C: "CPU", D: "SSD" }[engine.tiers[col]]})`;
  return `${engine.node}/${engine.name} — ${prefixLabel(p)} [${p.model}]: ${state.states[code]}` +
    `${tier}, ${depth}/${p.blocks} blocks, ${p.requests_1h} requests in the last hour`;
}

function engineRow(engine) {
  const tr = el("tr", { "data-engine": engine.id });
  const link = el("a", { href: `/engines/${engine.id}/`, text: engine.name,
                         title: `${engine.model} · ${engine.lifecycle}${engine.synced ? "" : " · not synced"}` });
  link.addEventListener("focus", () => { detail.textContent = `${engine.node}/${engine.name}: ${engine.model}, ${engine.lifecycle}`; });
  const th = el("th", { class: "eng", scope: "row" }, link);
  if (engine.engine_scoped_at) {
    // Blocks stored without token ids carry keys only this engine knows: no router can match them.
    const when = new Date(engine.engine_scoped_at).toLocaleString();
    th.append(" ", el("span", { class: "scoped", "data-field": "engine-scoped", text: "engine-scoped",
      title: `${engine.engine_scoped_blocks} engine-scoped keys (no token ids), last reported ${when}: ` +
             "gateways cannot route to these blocks by prefix" }));
  }
  tr.append(th);
  state.data.prefixes.forEach((p, col) => {
    const td = el("td", { class: `st-${engine.cells[col]}`, "data-col": col, "data-state": engine.cells[col] });
    td.title = cellTitle(engine, p, col);
    tr.append(td);
  });
  return tr;
}

function render() {
  const data = state.data;
  table.replaceChildren();
  state.engines.clear();
  document.getElementById("empty").hidden = data.engines.length > 0 && data.prefixes.length > 0;
  const head = el("tr", {}, el("th", { scope: "col", text: "node / engine", class: "eng" }));
  for (const p of data.prefixes) {
    head.append(el("th", { class: "p", scope: "col", title: `${p.tenant} / ${p.model} / ${p.group}: ${p.blocks} blocks, ${p.tokens} tokens, ${p.requests_1h} req/h` },
      el("div", { text: prefixLabel(p) })));
  }
  table.append(el("thead", {}, head));
  const body = el("tbody");
  let node = null;
  for (const engine of data.engines) {
    if (engine.node !== node) {
      node = engine.node;
      const link = el("a", { href: `/nodes/${engine.node_id}/`, text: node });
      const th = el("th", { colSpan: data.prefixes.length + 1 }, link, " ",
        el("span", { class: `state state-${engine.node_state}`, text: engine.node_state }));
      body.append(el("tr", { class: "node" }, th));
    }
    const row = engineRow(engine);
    state.engines.set(engine.id, row);
    body.append(row);
  }
  table.append(body);
  const end = Math.min(data.offset + data.engines.length, data.engines_total);
  document.getElementById("page-info").textContent =
    `engines ${data.engines_total ? data.offset + 1 : 0}–${end} of ${data.engines_total} · top ${data.prefixes.length} prefixes`;
  document.getElementById("prev").disabled = data.offset === 0;
  document.getElementById("next").disabled = end >= data.engines_total;
  renderVram(data.gpus);
}

function renderVram(gpus) {
  vram.replaceChildren();
  for (const g of gpus) {
    const total = g.total || 1;
    const bar = el("div", { class: "bar", "data-gpu": g.uuid });
    const parts = [["v-w", g.weights_runtime, "weights + runtime"], ["v-k", g.kv, "KV cache"],
                   ["v-s", g.speculative, "speculative"], ["v-p", g.kv_pool_free, "KV pool, unused"],
                   ["v-f", g.free, "free"]];
    for (const [cls, value, label] of parts) {
      if (!value) continue;
      bar.append(el("span", { class: cls, style: `width:${(100 * value / total).toFixed(2)}%`,
                              title: `${label}: ${fmtBytes(value)}` }));
    }
    const name = el("a", { href: `/gpus/${g.id}/`, text: `${g.node}/gpu${g.index}`, title: g.name });
    const used = g.used === null ? "unknown" : `${Math.round((100 * g.used) / total)}% used`;
    vram.append(name, bar, el("span", { class: "muted", text: g.lost ? "lost" : used }));
  }
}

async function load() {
  const q = `offset=${state.offset}&limit=${state.limit}&prefixes=${state.prefixes}`;
  state.data = await api("GET", `/api/cache-map/?${q}`);
  state.states = state.data.states;
  render();
  stat("updated", new Date().toLocaleTimeString());
}

// Live: refetch only the engines a delta touched, if they are on this page.
let pending = new Set();
let inFlight = false;
async function refresh() {
  if (inFlight || !pending.size) return;
  inFlight = true;
  const ids = [...pending];
  pending = new Set();
  try {
    const part = await api("GET", `/api/cache-map/?engines=${ids.join(",")}&prefixes=${state.prefixes}&limit=256`);
    const same = part.prefixes.map((p) => p.id).join() === state.data.prefixes.map((p) => p.id).join();
    if (!same) { await load(); return; }  // the hottest prefixes changed: redraw the columns
    for (const engine of part.engines) {
      const old = state.engines.get(engine.id);
      if (!old) continue;
      const fresh = engineRow(engine);
      [...fresh.querySelectorAll("td")].forEach((td, i) => {
        if (old.querySelectorAll("td")[i]?.dataset.state !== td.dataset.state) td.classList.add("changed");
      });
      old.replaceWith(fresh);
      state.engines.set(engine.id, fresh);
      const idx = state.data.engines.findIndex((e) => e.id === engine.id);
      if (idx >= 0) state.data.engines[idx] = engine;
    }
    const byId = new Map(state.data.gpus.map((g) => [g.id, g]));
    for (const g of part.gpus) byId.set(g.id, g);
    state.data.gpus = [...byId.values()];
    renderVram(state.data.gpus);
  } finally {
    inFlight = false;
    if (pending.size) refresh();
  }
}

onLive((msg) => {
  if (msg.type === "snapshot") {
    stat("nodes", msg.nodes.active); stat("stale", msg.nodes.stale); stat("engines", msg.engines);
    stat("plans", msg.open_plans); stat("jobs", msg.live_job_count);
    return;
  }
  stat("updated", new Date().toLocaleTimeString());
  if (msg.plans) stat("plans", "…");
  if (!state.data || !msg.residency) return;
  const known = msg.residency.engines.filter((id) => state.engines.has(id));
  const unknown = msg.residency.engines.length > known.length;
  if (unknown && state.data.engines.length < state.limit) { load(); return; }  // a new engine joined
  known.forEach((id) => pending.add(id));
  refresh();
});

table.addEventListener("mouseover", (ev) => {
  if (ev.target.tagName === "TD") detail.textContent = ev.target.title;
});
document.getElementById("prev").addEventListener("click", () => { state.offset = Math.max(0, state.offset - state.limit); load(); });
document.getElementById("next").addEventListener("click", () => { state.offset += state.limit; load(); });
document.getElementById("page-size").addEventListener("change", (ev) => { state.limit = Number(ev.target.value); state.offset = 0; load(); });
load();

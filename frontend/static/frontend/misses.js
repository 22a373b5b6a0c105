// The misses page: reasons stacked over time per tenant, delivered vs speed-of-light hit rate.
const COLOUR = { hit: "#009E73", partial: "#56B4E9", cold: "#0072B2", routed_away: "#E69F00",
                 evicted: "#D55E00", warming: "#CC79A7", variant: "#8a8f96" };
const LAYOUT = { margin: { l: 48, r: 8, t: 28, b: 28 }, font: { size: 11 }, barmode: "stack", bargap: 0,
                 legend: { orientation: "h", y: -0.2 }, paper_bgcolor: "#fff", plot_bgcolor: "#fff" };
const CONFIG = { displaylogo: false, responsive: true };

function data(id) {
  const node = document.getElementById(id);
  return node ? JSON.parse(node.textContent) : null;
}

const series = data("reason-series");
const holder = document.getElementById("reason-charts");
if (series && holder && window.Plotly) {
  const key = document.createElement("p");  // one legend for every tenant's chart
  key.id = "reason-legend";
  for (const [r, colour] of Object.entries(COLOUR)) {
    const item = document.createElement("span");
    const swatch = document.createElement("span");
    swatch.style.cssText = `display:inline-block;width:10px;height:10px;margin:0 4px 0 12px;background:${colour}`;
    item.append(swatch, r);
    key.appendChild(item);
  }
  holder.before(key);
  series.tenants.forEach((t, i) => {
    const div = document.createElement("div");
    div.className = "chart reason-chart";
    div.dataset.tenant = t.tenant;
    holder.appendChild(div);
    const traces = Object.keys(COLOUR).map((r) => ({ x: series.at, y: t[r], name: r, type: "bar",
      marker: { color: COLOUR[r] }, showlegend: false }));
    window.Plotly.newPlot(div, traces, { ...LAYOUT, title: { text: t.tenant, font: { size: 12 } },
      yaxis: { title: "requests" } }, CONFIG);
  });
}

const sol = data("sol-data");
if (sol && sol.length && window.Plotly && document.getElementById("sol-chart")) {
  const names = sol.map((t) => t.tenant);
  const pct = (k) => sol.map((t) => (t[k] === null ? null : 100 * t[k]));
  window.Plotly.newPlot("sol-chart", [
    { x: names, y: pct("delivered_hit_rate"), name: "delivered", type: "bar", marker: { color: "#0072B2" } },
    { x: names, y: pct("speed_of_light_hit_rate"), name: "speed of light", type: "bar", marker: { color: "#E69F00" } },
  ], { ...LAYOUT, barmode: "group", title: undefined, yaxis: { title: "hit rate %", range: [0, 100] } }, CONFIG);
}

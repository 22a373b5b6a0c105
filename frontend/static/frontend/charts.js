// Plotly charts fed by json_script blocks: GPU memory history and forecast vs actual.
const C = { blue: "#0072B2", orange: "#E69F00", green: "#009E73", sky: "#56B4E9", grey: "#8a8f96",
            vermillion: "#D55E00", purple: "#CC79A7", black: "#000000" };
const PALETTE = [C.blue, C.orange, C.green, C.vermillion, C.purple, C.sky, C.black, C.grey];
const LAYOUT = { margin: { l: 56, r: 16, t: 8, b: 36 }, font: { size: 11 }, legend: { orientation: "h", y: -0.18 },
                 paper_bgcolor: "#fff", plot_bgcolor: "#fff", hovermode: "x unified" };
const CONFIG = { displaylogo: false, responsive: true };
const GIB = 1024 ** 3;

function data(id) {
  const node = document.getElementById(id);
  return node ? JSON.parse(node.textContent) : null;
}
const gib = (xs) => xs.map((v) => (v === null ? null : v / GIB));

const history = data("history-data");
if (history && window.Plotly) {
  const traces = [];
  history.forEach((h, i) => {
    const colour = PALETTE[i % PALETTE.length];
    traces.push({ x: h.at, y: gib(h.memory_used), name: `${h.gpu} used`, line: { color: colour } });
    if (h.speculative_bytes.some((v) => v)) {
      traces.push({ x: h.at, y: gib(h.speculative_bytes), name: `${h.gpu} speculative`,
                    line: { color: colour, dash: "dot" } });
    }
  });
  const total = Math.max(...history.map((h) => h.total || 0)) / GIB;
  window.Plotly.newPlot("history-chart", traces, { ...LAYOUT, yaxis: { title: "GiB", range: [0, total * 1.05 || null] } }, CONFIG);
}

const fc = data("forecast-data");
if (fc && window.Plotly) {
  const traces = [{ x: fc.actual_at, y: fc.actual, name: "actual requests", mode: "lines", line: { color: C.black, width: 1.5 } }];
  if (fc.yhat) {
    traces.push({ x: fc.forecast_at, y: fc.upper, name: "upper", line: { width: 0 }, showlegend: false, hoverinfo: "skip" });
    traces.push({ x: fc.forecast_at, y: fc.lower, name: "interval", fill: "tonexty", fillcolor: "rgba(86,180,233,0.3)",
                  line: { width: 0 } });
    traces.push({ x: fc.forecast_at, y: fc.yhat, name: `forecast (${fc.model})`, line: { color: C.blue, width: 2 } });
  }
  window.Plotly.newPlot("forecast-chart", traces, { ...LAYOUT, yaxis: { title: "requests / bucket", rangemode: "tozero" } }, CONFIG);
}

// The scoreboard's holdout: TTFT of the requests of treated vs held-out assignments, as each
// arm's cumulative distribution on a log axis (a few queued requests seconds long would squash
// a histogram's bins into one).
const holdout = data("holdout-data");
if (holdout && window.Plotly && (holdout.treated.length || holdout.held_out.length)) {
  const ecdf = (xs, name, color) => {
    const s = xs.filter((x) => x > 0).sort((a, b) => a - b);
    return { x: s, y: s.map((_, i) => (i + 1) / s.length), name, mode: "lines",
             line: { color, width: 2, shape: "hv" } };
  };
  window.Plotly.newPlot("holdout-chart",
    [ecdf(holdout.treated, `treated (${holdout.treated.length} requests)`, C.blue),
     ecdf(holdout.held_out, `held out (${holdout.held_out.length} requests)`, C.orange)],
    { ...LAYOUT, hovermode: "closest", xaxis: { title: "TTFT (s)", type: "log" },
      yaxis: { title: "share of requests at or below", range: [0, 1] } }, CONFIG);
}

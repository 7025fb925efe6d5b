// Charts of the dashboard (plotly.js, served from the installed Python package). The four risk
// layers have one colour each, used the same way on every chart and table (Okabe-Ito palette:
// distinguishable with the common colour-vision deficiencies).
/* global Plotly */

import { fmtPct, fmtUsd, fmtNum, plain } from "./format.js";

export const LAYERS = {
  market: { label: "Market", color: "#0072B2" },
  sector: { label: "Sector", color: "#E69F00" },
  subsector: { label: "Subsector", color: "#009E73" },
  residual: { label: "Residual", color: "#8C8C8C" },
};
const STOCK_COLOR = "#1b1b1b";
// Daily return colours of the treemap: red down, green up, a light grey for flat; the label
// also carries the signed number, so colour is never the only cue.
const RETURN_SCALE = [
  [0, "#b2182b"],
  [0.5, "#ececec"],
  [1, "#1a7f37"],
];
const RETURN_CLIP = 0.03; // +-3% saturates the colour

// Which columns of a /api/ticker-returns row make each level's view.
export const LEVELS = {
  1: {
    name: "L1: market ETF",
    hr: [["l1_mkt_hr", "market"]],
    er: [["l1_mkt_er", "market"], ["l1_res_er", "residual"]],
    rr: "l1_rr",
  },
  2: {
    name: "L2: market + sector ETFs",
    hr: [["l2_mkt_hr", "market"], ["l2_sec_hr", "sector"]],
    er: [["l2_mkt_er", "market"], ["l2_sec_er", "sector"], ["l2_res_er", "residual"]],
    rr: "l2_rr",
  },
  3: {
    name: "L3: market + sector + subsector ETFs",
    hr: [["l3_mkt_hr", "market"], ["l3_sec_hr", "sector"], ["l3_sub_hr", "subsector"]],
    er: [
      ["l3_mkt_er", "market"],
      ["l3_sec_er", "sector"],
      ["l3_sub_er", "subsector"],
      ["l3_res_er", "residual"],
    ],
    rr: "l3_rr",
  },
};

// No mode bar: it covers small charts; drag zooms, a double click resets.
const CONFIG = { responsive: true, displaylogo: false, displayModeBar: false };

// No plotly legend: each chart function returns its legend entries ({name, color}) and the
// page draws them above the plot (ui.js chartLegend), where they wrap instead of covering it.
function baseLayout(extra) {
  return {
    margin: { l: 48, r: 12, t: 8, b: 32 },
    paper_bgcolor: "rgba(0,0,0,0)",
    plot_bgcolor: "rgba(0,0,0,0)",
    font: { family: "system-ui, -apple-system, Segoe UI, Roboto, sans-serif", size: 12 },
    showlegend: false,
    hovermode: "x unified",
    ...extra,
  };
}

function legendOf(traces, names) {
  return traces.map((t, i) => ({ name: names[i], color: t.line ? t.line.color : t.marker.color }));
}

export function purge(div) {
  if (div && div.data) Plotly.purge(div);
}

// The market treemap: area = market cap, colour = latest daily return, grouped by sector.
// `onOpen(ticker)` is called when a stock (a leaf) is clicked; a sector click zooms into it.
// A stale stock (row.staleness.stale, adapt.js) says so on its rectangle and in its hover.
export function treemap(div, rows, onOpen) {
  const bySector = new Map();
  for (const r of rows) {
    const sector = r.sector || "Unclassified";
    if (!bySector.has(sector)) bySector.set(sector, []);
    bySector.get(sector).push(r);
  }
  const weighted = (list) => {
    let cap = 0;
    let sum = 0;
    for (const r of list) {
      if (r.return_1d === null || r.market_cap === null) continue;
      cap += r.market_cap;
      sum += r.market_cap * r.return_1d;
    }
    return cap > 0 ? sum / cap : null;
  };
  const total = rows.reduce((s, r) => s + r.market_cap, 0);
  const ids = ["market"];
  const labels = ["Market"];
  const parents = [""];
  const values = [total];
  const colors = [weighted(rows)];
  const custom = [["All stocks shown", `${rows.length} stocks`, fmtPct(colors[0], 2, true), fmtUsd(total), ""]];
  for (const [sector, list] of bySector) {
    const cap = list.reduce((s, r) => s + r.market_cap, 0);
    const ret = weighted(list);
    ids.push(`sector/${sector}`);
    labels.push(plain(sector));
    parents.push("market");
    values.push(cap);
    colors.push(ret);
    custom.push([`${list.length} stocks`, plain(sector), fmtPct(ret, 2, true), fmtUsd(cap), ""]);
  }
  for (const r of rows) {
    ids.push(`stock/${r.ticker}`);
    labels.push(plain(r.ticker));
    parents.push(`sector/${r.sector || "Unclassified"}`);
    values.push(r.market_cap);
    colors.push(r.return_1d);
    const stale = r.staleness && r.staleness.stale ? `<br>stale: last priced ${r.staleness.lastSession}` : "";
    custom.push([plain(r.company_name || ""), plain(r.sector || ""), fmtPct(r.return_1d, 2, true), fmtUsd(r.market_cap), stale]);
  }
  const trace = {
    type: "treemap",
    ids,
    labels,
    parents,
    values,
    branchvalues: "total",
    customdata: custom,
    texttemplate: "<b>%{label}</b><br>%{customdata[2]}%{customdata[4]}",
    hovertemplate:
      "<b>%{label}</b> %{customdata[0]}<br>%{customdata[1]}<br>" +
      "Return %{customdata[2]}<br>Market cap %{customdata[3]}%{customdata[4]}<extra></extra>",
    marker: {
      colors: colors.map((c) => (c === null ? 0 : c)),
      colorscale: RETURN_SCALE,
      cmid: 0,
      cmin: -RETURN_CLIP,
      cmax: RETURN_CLIP,
      showscale: true,
      colorbar: { title: { text: "1-day" }, tickformat: "+.0%", thickness: 10, len: 0.6 },
      line: { width: 1, color: "#ffffff" },
    },
    pathbar: { visible: true },
    tiling: { pad: 1 },
  };
  const layout = { margin: { l: 4, r: 4, t: 28, b: 4 }, paper_bgcolor: "rgba(0,0,0,0)" };
  Plotly.react(div, [trace], layout, CONFIG);
  div.removeAllListeners && div.removeAllListeners("plotly_treemapclick");
  div.on("plotly_treemapclick", (event) => {
    const id = event.points && event.points[0] && event.points[0].id;
    if (id && id.startsWith("stock/")) {
      onOpen(id.slice("stock/".length));
      return false; // open the stock instead of zooming
    }
    return true;
  });
}

function series(rows, column) {
  return rows.map((r) => (r[column] === undefined ? null : r[column]));
}

// Stacked explained-risk shares of one level over time (they sum to 1 where published).
export function riskShares(div, rows, level) {
  const x = series(rows, "date");
  const traces = LEVELS[level].er.map(([column, layer]) => ({
    type: "scatter",
    mode: "lines",
    name: LAYERS[layer].label,
    x,
    y: series(rows, column),
    stackgroup: "er",
    line: { width: 0.5, color: LAYERS[layer].color },
    fillcolor: LAYERS[layer].color,
    hovertemplate: "%{y:.1%}",
  }));
  Plotly.react(div, traces, baseLayout({ yaxis: { tickformat: ".0%", range: [0, 1] } }), CONFIG);
  return legendOf(traces, LEVELS[level].er.map(([, layer]) => LAYERS[layer].label));
}

// Hedge-ratio lines of one level: dollars of each ETF per $1 of the stock.
export function hedgeRatios(div, rows, level, etfs) {
  const x = series(rows, "date");
  const traces = LEVELS[level].hr.map(([column, layer]) => ({
    type: "scatter",
    mode: "lines",
    name: `${LAYERS[layer].label}${etfs[layer] ? ` (${plain(etfs[layer])})` : ""}`,
    x,
    y: series(rows, column),
    line: { width: 1.6, color: LAYERS[layer].color },
    hovertemplate: "%{y:.3f}",
  }));
  Plotly.react(div, traces, baseLayout({ yaxis: { zeroline: true, zerolinecolor: "#bbb" } }), CONFIG);
  const names = LEVELS[level].hr.map(([, layer]) => `${LAYERS[layer].label}${etfs[layer] ? ` (${etfs[layer]})` : ""}`);
  return legendOf(traces, names);
}

// Compounded return over the window, skipping days without a return (shown as gaps).
export function cumulative(values) {
  let level = 1;
  return values.map((r) => {
    if (r === null || r === undefined) return null;
    level *= 1 + r;
    return level - 1;
  });
}

// The stock's cumulative return next to its hedged (residual) return at the chosen level.
export function hedgedReturn(div, rows, level, ticker) {
  const x = series(rows, "date");
  const traces = [
    {
      type: "scatter",
      mode: "lines",
      name: `${plain(ticker)} (unhedged)`,
      x,
      y: cumulative(series(rows, "returns_gross")),
      line: { width: 1.6, color: STOCK_COLOR },
      hovertemplate: "%{y:.1%}",
    },
    {
      type: "scatter",
      mode: "lines",
      name: `Hedged at L${level} (residual)`,
      x,
      y: cumulative(series(rows, LEVELS[level].rr)),
      line: { width: 1.6, color: LAYERS.residual.color },
      hovertemplate: "%{y:.1%}",
    },
  ];
  Plotly.react(div, traces, baseLayout({ yaxis: { tickformat: ".0%", zeroline: true, zerolinecolor: "#bbb" } }), CONFIG);
  return legendOf(traces, [`${ticker} (unhedged)`, `Hedged at L${level} (residual)`]);
}

// Each position's L3 explained-risk shares, one stacked bar per ticker.
export function positionShares(div, positions) {
  const y = positions.map((p) => plain(p.ticker));
  const traces = LEVELS[3].er.map(([column, layer]) => ({
    type: "bar",
    orientation: "h",
    name: LAYERS[layer].label,
    y,
    x: positions.map((p) => p.metrics[column] ?? null),
    marker: { color: LAYERS[layer].color },
    hovertemplate: "%{x:.1%}",
  }));
  const layout = baseLayout({
    barmode: "stack",
    hovermode: "y unified",
    xaxis: { tickformat: ".0%", range: [0, 1] },
    yaxis: { autorange: "reversed" },
    margin: { l: 56, r: 12, t: 8, b: 28 },
  });
  Plotly.react(div, traces, layout, CONFIG);
  return legendOf(traces, LEVELS[3].er.map(([, layer]) => LAYERS[layer].label));
}

// The portfolio's hedge: the dollars of each ETF to sell (negative: buy), coloured by level.
export function portfolioHedge(div, hedges) {
  const trace = {
    type: "bar",
    x: hedges.map((h) => plain(h.etf)),
    y: hedges.map((h) => h.dollars),
    marker: { color: hedges.map((h) => LAYERS[h.layer].color) },
    customdata: hedges.map((h) => [LAYERS[h.layer].label, fmtUsd(h.dollars), fmtNum(h.perDollar, 3)]),
    hovertemplate: "%{x} (%{customdata[0]}): %{customdata[1]}, %{customdata[2]} per $1 of the book<extra></extra>",
  };
  const layout = baseLayout({ hovermode: "closest", yaxis: { zeroline: true, zerolinecolor: "#bbb" } });
  Plotly.react(div, [trace], layout, CONFIG);
  const layers = Object.keys(LAYERS).filter((layer) => hedges.some((h) => h.layer === layer));
  return layers.map((layer) => ({ name: LAYERS[layer].label, color: LAYERS[layer].color }));
}

// The risk model's predicted volatility of each session (forecast the session before) next to
// the realised one (21 sessions of returns), both annualised.
export function predictedVol(div, rows) {
  const x = series(rows, "date");
  const r = series(rows, "returns_gross");
  const realised = r.map((_, i) => {
    const w = r.slice(Math.max(0, i - 20), i + 1).filter((v) => v !== null && v !== undefined);
    if (w.length < 15) return null;
    const m = w.reduce((s, v) => s + v, 0) / w.length;
    return Math.sqrt((w.reduce((s, v) => s + (v - m) ** 2, 0) / (w.length - 1)) * 252);
  });
  const predicted = series(rows, "risk_total_vol").map((v) => (v === null || v === undefined ? null : v * Math.sqrt(252)));
  const traces = [
    { type: "scatter", mode: "lines", name: "Predicted", x, y: predicted, line: { width: 1.6, color: STOCK_COLOR }, hovertemplate: "%{y:.1%}" },
    { type: "scatter", mode: "lines", name: "Realised (21 sessions)", x, y: realised, line: { width: 1.2, color: LAYERS.residual.color }, hovertemplate: "%{y:.1%}" },
  ];
  Plotly.react(div, traces, baseLayout({ yaxis: { tickformat: ".0%", rangemode: "tozero" } }), CONFIG);
  return legendOf(traces, ["Predicted", "Realised (21 sessions)"]);
}

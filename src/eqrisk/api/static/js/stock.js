// The stock page: the latest snapshot (/api/metrics), its history (/api/ticker-returns) and, with
// a paid key, its macro correlations (/api/metrics/{ticker}/correlation): asked one after the
// other (a refused ticker costs the rate limit once); a level switch redraws from the cached
// answers without asking again. The demo key does not ask the correlations: its five requests a
// minute go to the views.

import { readMetrics } from "./adapt.js";
import * as charts from "./charts.js";
import { el, fmtNum, fmtPct, fmtUsd } from "./format.js";
import { DEMO_TICKERS, go, state, viewSignal } from "./state.js";
import { button, chartCard, costLine, isCancelled, problemPanel, showMetadata, showProblem, staleBadge } from "./ui.js";

const YEARS = [1, 2, 3, 5, 10];

export function stockPage(view, ticker, params) {
  if (!ticker) {
    view.append(
      el("div", { class: "page-head" }, el("h1", {}, "Stock"), el("p", { class: "lede" }, "Search for a ticker or a company name above.")),
      ...(state.isDemo
        ? [el("p", { class: "chips" }, "The demo key covers: ", ...DEMO_TICKERS.map((t) => el("a", { class: "chip", href: `#/stock/${t}` }, t)))]
        : []),
    );
    return;
  }
  ticker = ticker.toUpperCase();
  const signal = viewSignal();
  const years = YEARS.includes(Number(params.get("years"))) ? Number(params.get("years")) : 3;
  const level = [1, 2, 3].includes(Number(params.get("level"))) ? Number(params.get("level")) : 3;
  const yearsSel = el("select", { id: "years", "aria-label": "Years of history" }, YEARS.map((y) => el("option", { value: y, selected: y === years }, `${y} ${y === 1 ? "year" : "years"}`)));
  const levelSel = el("select", { id: "level", "aria-label": "Hedge level" }, [1, 2, 3].map((k) => el("option", { value: k, selected: k === level }, charts.LEVELS[k].name)));
  const fmtSel = el("select", { id: "download-format", "aria-label": "Download format" }, el("option", { value: "csv" }, "CSV"), el("option", { value: "parquet" }, "Parquet"));
  const viewCalls = () => [
    { endpoint: `metrics/${ticker}`, params: {}, label: "snapshot" },
    { endpoint: "ticker-returns", params: { ticker, years: Number(yearsSel.value) }, label: `${yearsSel.value} y of returns` },
    ...(state.isDemo ? [] : [{ endpoint: `metrics/${ticker}/correlation`, params: {}, label: "macro correlations" }]),
  ];
  const cost = costLine(viewCalls);
  const downloadCost = costLine(() => [
    { endpoint: "ticker-returns", params: { ticker, years: Number(yearsSel.value), format: fmtSel.value }, label: "download" },
  ]);
  yearsSel.addEventListener("change", () => { cost.refresh(); downloadCost.refresh(); });
  fmtSel.addEventListener("change", downloadCost.refresh);
  levelSel.addEventListener("change", () => go(`#/stock/${encodeURIComponent(ticker)}?years=${years}&level=${levelSel.value}`));
  const load = button("Load", () => go(`#/stock/${encodeURIComponent(ticker)}?years=${yearsSel.value}&level=${levelSel.value}`), { id: "load-stock" });
  const downloadOut = el("span", { class: "download-out" });
  const download = button("Download", async () => {
    downloadOut.textContent = "downloading\u2026";
    try {
      const file = await state.client.download("/api/ticker-returns", { ticker, years: Number(yearsSel.value), format: fmtSel.value }, signal);
      const url = URL.createObjectURL(file.blob);
      const a = el("a", { href: url, download: file.filename });
      document.body.append(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 10000);
      downloadOut.textContent = `${file.filename} (${Math.round(file.blob.size / 1024)} kB)`;
    } catch (err) {
      if (!isCancelled(err)) downloadOut.replaceChildren(problemPanel(err, null, "inline"));
    }
  }, { id: "download" });

  const head = el("div", { class: "page-head" }, el("h1", { id: "stock-title" }, ticker));
  const snapshot = el("section", { class: "snapshot", id: "snapshot", "aria-label": "Latest snapshot" });
  const chartsArea = el("section", { class: "charts", id: "stock-charts" });
  const macro = el("section", { class: "macro", id: "macro", "aria-label": "Macro correlations" });
  view.append(
    head,
    el("div", { class: "controls" }, yearsSel, load, levelSel, cost.node),
    snapshot,
    chartsArea,
    macro,
    el("div", { class: "controls download" }, el("span", {}, "Download these rows as"), fmtSel, download, downloadCost.node, downloadOut),
  );

  const fetchIt = async () => {
    snapshot.replaceChildren(el("p", { class: "muted" }, "Loading\u2026"));
    chartsArea.replaceChildren();
    macro.replaceChildren();
    let snap;
    try {
      snap = readMetrics(await state.client.get(`/api/metrics/${encodeURIComponent(ticker)}`, null, signal));
    } catch (err) {
      if (isCancelled(err)) return;
      snapshot.replaceChildren();
      showProblem(chartsArea, err, fetchIt);
      return;
    }
    renderSnapshot(head, snapshot, snap);
    const cards = chartCards(chartsArea, level, years);
    try {
      const doc = await state.client.get("/api/ticker-returns", { ticker, years }, signal);
      showMetadata(doc._metadata);
      const rows = doc.data;
      if (!rows.length) {
        chartsArea.replaceChildren(el("p", { class: "empty" }, doc.meta.note || "No rows in this window."));
        return;
      }
      const etfs = { market: doc.meta.market_etf, sector: doc.meta.sector_etf, subsector: doc.meta.subsector_etf };
      for (const card of Object.values(cards)) card.div.dataset.rows = String(rows.length);
      cards.shares.draw(charts.riskShares, rows, level);
      cards.hedges.draw(charts.hedgeRatios, rows, level, etfs);
      cards.returns.draw(charts.hedgedReturn, rows, level, ticker);
      cards.vol.draw(charts.predictedVol, rows);
    } catch (err) {
      showProblem(chartsArea, err, fetchIt);
      return;
    }
    if (state.isDemo) {
      macro.replaceChildren(el("p", { class: "muted", id: "macro-note" }, "Macro correlations are not asked with the demo key: its five requests a minute go to the views."));
      return;
    }
    macro.replaceChildren(el("p", { class: "muted" }, "Loading macro correlations\u2026"));
    try {
      renderMacro(macro, await state.client.get(`/api/metrics/${encodeURIComponent(ticker)}/correlation`, null, signal));
    } catch (err) {
      if (!isCancelled(err)) macro.replaceChildren(problemPanel(err, fetchIt, "inline"));
    }
  };
  fetchIt();
}

// One row per factor of the answer: its correlation (or "no data" where the data set lacks the
// factor's ETF or the overlap is under 30 sessions), the ETF read, and the proxy it stands for.
function renderMacro(section, doc) {
  const sources = doc.sources || {};
  const rows = Object.entries(doc.correlations).map(([key, value]) => {
    const src = sources[key] || {};
    const etf = src.etf ? (src.proxy_for ? `${src.etf} (proxy for ${src.proxy_for})` : src.etf) : "";
    return el("tr", { dataset: { factor: key } },
      el("th", { scope: "row" }, key.replace(/_/g, " ")),
      el("td", { dataset: { value: value ?? "" }, class: value === null ? "muted" : "" }, value === null ? "no data" : fmtNum(value, 3)),
      el("td", { class: "muted", dataset: { etf: src.etf || "", proxyFor: src.proxy_for || "" } }, etf));
  });
  const span = `${doc.method}, ${doc.return_type.replace(/_/g, " ")} returns, last ${doc.overlap_days || doc.window_days} sessions`;
  section.replaceChildren(
    el("table", { class: "grid", id: "macro-table" },
      el("caption", {}, `Macro and style factor correlations (${span})`),
      el("thead", {}, el("tr", {}, el("th", {}, "Factor"), el("th", {}, "Correlation"), el("th", {}, "ETF"))),
      el("tbody", {}, rows)),
  );
}

function chartCards(area, level, years) {
  const span = `${years} ${years === 1 ? "year" : "years"}, L${level}`;
  const cards = {
    shares: chartCard("chart-shares", "Explained risk", `share of variance by layer (${span})`),
    hedges: chartCard("chart-hedges", "Hedge ratios", `ETF dollars per $1 of stock (${span})`),
    returns: chartCard("chart-returns", "Cumulative return", `stock vs hedged residual (${span})`),
    vol: chartCard("chart-vol", "Volatility", "predicted by the risk model vs realised, annualised"),
  };
  area.append(...Object.values(cards).map((c) => c.figure));
  return cards;
}

function renderSnapshot(head, section, snap) {
  const m = snap.metrics;
  const meta = snap.meta;
  const stale = snap.staleness;
  head.replaceChildren(...[
    el("h1", { id: "stock-title" }, snap.ticker, " ", el("span", { class: "company" }, meta.company_name || ""), " ", staleBadge(stale, snap.ticker)),
    el("p", { class: "lede" }, [meta.sector, meta.industry].filter(Boolean).join(" \u00b7 ") || meta.asset_type || "",
      snap.teo ? el("span", { class: "muted" }, ` \u00b7 latest session ${snap.teo}`) : null),
    stale.stale
      ? el("p", { class: "note stale-note" },
        `Last priced on ${stale.lastSession}, ${stale.behind} session${stale.behind === 1 ? "" : "s"} before the data date: every value below is from that session.`)
      : null,
  ].filter(Boolean));
  const etf = { market: meta.market_etf, sector: meta.sector_etf, subsector: meta.subsector_etf };
  const stat = (label, value, name) => el("div", { class: "stat", dataset: { metric: name } }, el("span", { class: "muted" }, label), el("b", {}, value));
  const layerHead = (layer) => el("th", { scope: "col" }, el("i", { class: `swatch ${layer}` }), charts.LAYERS[layer].label, etf[layer] ? el("span", { class: "muted etf" }, etf[layer]) : null);
  const cell = (value, fmt, name) => el("td", { dataset: { metric: name, value: value ?? "" } }, fmt(value));
  const hrRows = [1, 2, 3].map((k) => el("tr", {}, el("th", { scope: "row" }, `L${k}`),
    ["mkt", "sec", "sub"].map((x, i) => (i < k ? cell(m[`l${k}_${x}_hr`], (v) => fmtNum(v, 3), `l${k}_${x}_hr`) : el("td", { class: "muted" }, "")))));
  const erRows = [1, 2, 3].map((k) => el("tr", {}, el("th", { scope: "row" }, `L${k}`),
    ["mkt", "sec", "sub"].map((x, i) => (i < k ? cell(m[`l${k}_${x}_er`], fmtPct, `l${k}_${x}_er`) : el("td", { class: "muted" }, ""))),
    cell(m[`l${k}_res_er`], fmtPct, `l${k}_res_er`)));
  const bar = el("div", { class: "share-bar", "aria-label": "L3 explained-risk shares" },
    [["l3_mkt_er", "market"], ["l3_sec_er", "sector"], ["l3_sub_er", "subsector"], ["l3_res_er", "residual"]]
      .filter(([c]) => m[c] !== null && m[c] > 0)
      .map(([c, layer]) => el("span", { class: `swatch-bg ${layer}`, style: `width:${(m[c] * 100).toFixed(2)}%`, title: `${charts.LAYERS[layer].label} ${fmtPct(m[c])}` })));
  section.replaceChildren(
    el("div", { class: "stats" },
      stat("Volatility 23d", fmtPct(m.vol_23d), "vol_23d"),
      stat("Volatility 252d", fmtPct(m.vol_252d_ann), "vol_252d_ann"),
      stat("Close", fmtNum(m.price_close), "price_close"),
      stat("Market cap", fmtUsd(m.market_cap), "market_cap"),
    ),
    el("div", { class: "tables" },
      el("table", { class: "grid", id: "hedge-table" },
        el("caption", {}, "Hedge ratios: ETF dollars to sell per $1 of stock"),
        el("thead", {}, el("tr", {}, el("th", {}, "Level"), layerHead("market"), layerHead("sector"), layerHead("subsector"))),
        el("tbody", {}, hrRows)),
      el("table", { class: "grid", id: "share-table" },
        el("caption", {}, "Explained risk: share of variance"),
        el("thead", {}, el("tr", {}, el("th", {}, "Level"), layerHead("market"), layerHead("sector"), layerHead("subsector"), layerHead("residual"))),
        el("tbody", {}, erRows)),
    ),
    bar,
  );
}

// The portfolio page: positions entered in dollars or in percent of a value, analysed in one
// request (/api/batch/analyze, full_metrics), and the ETF hedge that neutralises the book's
// market, sector and subsector exposure.
//
// Everything drawn comes from one object, the book (`makeBook`): its positions in dollars, each
// position's latest L3 metrics and the hedge. The page is the list SECTIONS of functions of the
// book, each returning its part ({node, draw?}); another part (for instance the book's predicted
// volatility before and after the hedge) is one more function in that list.

import { readBatch } from "./adapt.js";
import * as charts from "./charts.js";
import { el, fmtNum, fmtPct, fmtUsd } from "./format.js";
import { go, state, viewSignal } from "./state.js";
import { button, chartCard, costLine, showMetadata, showProblem, staleBadge } from "./ui.js";

const DEFAULT_POSITIONS = "AAPL:40,MSFT:30,NVDA:30";
const DEFAULT_VALUE = 1000000;
export const UNITS = { pct: "% of value", usd: "USD" };

// ----------------------------------------------------------------------------- the book

// "T:amount,T:amount" -> [{ticker, amount}] (amount: percent or dollars, by the units).
export function parsePositions(text) {
  const out = [];
  for (const part of (text || "").split(",")) {
    const [t, a] = part.split(":");
    if (t && t.trim()) out.push({ ticker: t.trim().toUpperCase(), amount: Number(a) });
  }
  return out;
}

// Each position in dollars, and the value a dollar of hedge is counted against: the value
// given (percent units) or the book's gross, the sum of |dollars| (dollar units).
export function inDollars(positions, units, value) {
  const dollars = positions.map((p) => ({
    ticker: p.ticker,
    dollars: Number.isFinite(p.amount) ? (units === "usd" ? p.amount : (p.amount / 100) * value) : 0,
  }));
  const gross = dollars.reduce((s, p) => s + Math.abs(p.dollars), 0);
  return { dollars, basis: units === "usd" ? gross : value };
}

// The hedge: per ETF, the sum over the positions that use it of dollars x L3 hedge ratio
// (ETF dollars to sell; negative: to buy), and the same per $1 of the basis.
export function portfolioHedges(dollars, entries, basis) {
  const byTicker = new Map(dollars.map((p) => [p.ticker, p.dollars]));
  const hedges = new Map();
  for (const e of entries) {
    if (!e.ok) continue;
    const m = e.snapshot.metrics;
    const meta = e.snapshot.meta;
    for (const [layer, column, etf] of [
      ["market", "l3_mkt_hr", meta.market_etf],
      ["sector", "l3_sec_hr", meta.sector_etf],
      ["subsector", "l3_sub_hr", meta.subsector_etf],
    ]) {
      if (!etf || m[column] === null || m[column] === undefined) continue;
      const key = `${layer}/${etf}`;
      const h = hedges.get(key) || { etf, layer, dollars: 0, positions: [] };
      h.dollars += (byTicker.get(e.ticker) || 0) * m[column];
      h.positions.push(e.ticker);
      hedges.set(key, h);
    }
  }
  const order = { market: 0, sector: 1, subsector: 2 };
  return [...hedges.values()]
    .map((h) => ({ ...h, perDollar: basis ? h.dollars / basis : null }))
    .sort((a, b) => order[a.layer] - order[b.layer] || a.etf.localeCompare(b.etf));
}

export function makeBook(positions, units, value, entries) {
  const { dollars, basis } = inDollars(positions, units, value);
  return {
    units,
    basis, // the value given, or the gross in dollar units
    positions: dollars, // [{ticker, dollars}]
    entries, // readBatch's, in answer order
    ok: entries.filter((e) => e.ok),
    hedges: portfolioHedges(dollars, entries, basis),
  };
}

// ----------------------------------------------------------------------------- sections

function hedgeSection(book) {
  const basis = book.units === "usd" ? `gross ${fmtUsd(book.basis)}` : `value ${fmtUsd(book.basis)}`;
  const table = el("table", { class: "grid", id: "hedge-notional" },
    el("caption", {}, `The portfolio's hedge (${basis})`),
    el("thead", {}, el("tr", {}, ["ETF", "To neutralise", "Per $1", "Layer", "From"].map((h) => el("th", { scope: "col" }, h)))),
    el("tbody", {}, book.hedges.map((h) => el("tr", { dataset: { etf: h.etf, layer: h.layer, usd: String(h.dollars), perDollar: String(h.perDollar) } },
      el("th", { scope: "row" }, h.etf),
      el("td", { class: h.dollars >= 0 ? "sell" : "buy" }, `${h.dollars >= 0 ? "Sell" : "Buy"} ${fmtUsd(Math.abs(h.dollars))}`),
      el("td", {}, fmtNum(h.perDollar, 4)),
      el("td", {}, el("i", { class: `swatch ${h.layer}` }), charts.LAYERS[h.layer].label),
      el("td", { class: "muted from" }, h.positions.join(", ")),
    ))),
  );
  return { node: el("div", { class: "tables" }, table) };
}

function chartsSection(book) {
  const hedge = chartCard("chart-portfolio-hedge", "Hedge notional per ETF", "USD; positive = sell");
  const shares = chartCard("chart-position-shares", "Explained risk by position", "L3 shares of variance");
  hedge.div.classList.add("short");
  shares.div.classList.add("short");
  hedge.div.dataset.rows = String(book.hedges.length);
  shares.div.dataset.rows = String(book.ok.length);
  return {
    node: el("div", { class: "charts two" }, hedge.figure, shares.figure),
    draw: () => {
      hedge.draw(charts.portfolioHedge, book.hedges);
      shares.draw(charts.positionShares, book.ok.map((e) => ({ ticker: e.ticker, metrics: e.snapshot.metrics })));
    },
  };
}

function positionsSection(book) {
  const dollars = new Map(book.positions.map((p) => [p.ticker, p.dollars]));
  const heads = ["Ticker", "Position", "Market HR", "Sector HR", "Subsector HR", ...["market", "sector", "subsector", "residual"].map((l) => charts.LAYERS[l].label)];
  const cell = (label, v, fmt, name) => el("td", { dataset: { label, metric: name, value: v ?? "" } }, fmt(v));
  const position = (d) => `${fmtUsd(d)} (${fmtPct(book.basis ? d / book.basis : null)})`;
  const table = el("table", { class: "grid stack", id: "position-table" },
    el("caption", {}, "Positions: L3 hedge ratios and explained-risk shares"),
    el("thead", {}, el("tr", {}, heads.map((h) => el("th", { scope: "col" }, h)))),
    el("tbody", {}, book.entries.map((e) => {
      if (!e.ok) {
        return el("tr", { class: "error-row", dataset: { ticker: e.ticker } }, el("th", { scope: "row" }, e.ticker), el("td", { colspan: 8 }, `${e.error.code}: ${e.error.detail}`));
      }
      const m = e.snapshot.metrics;
      const meta = e.snapshot.meta;
      return el("tr", { dataset: { ticker: e.ticker, usd: String(dollars.get(e.ticker) ?? "") } },
        el("th", { scope: "row" }, el("a", { href: `#/stock/${encodeURIComponent(e.ticker)}` }, e.ticker), " ", staleBadge(e.snapshot.staleness, e.ticker)),
        el("td", { dataset: { label: heads[1] } }, position(dollars.get(e.ticker))),
        cell(heads[2], m.l3_mkt_hr, (v) => `${fmtNum(v, 3)} ${meta.market_etf || ""}`, "l3_mkt_hr"),
        cell(heads[3], m.l3_sec_hr, (v) => `${fmtNum(v, 3)} ${meta.sector_etf || ""}`, "l3_sec_hr"),
        cell(heads[4], m.l3_sub_hr, (v) => (meta.subsector_etf ? `${fmtNum(v, 3)} ${meta.subsector_etf}` : "\u2014"), "l3_sub_hr"),
        cell(heads[5], m.l3_mkt_er, fmtPct, "l3_mkt_er"),
        cell(heads[6], m.l3_sec_er, fmtPct, "l3_sec_er"),
        cell(heads[7], m.l3_sub_er, fmtPct, "l3_sub_er"),
        cell(heads[8], m.l3_res_er, fmtPct, "l3_res_er"),
      );
    })),
  );
  const failed = book.entries.length - book.ok.length;
  return {
    node: el("div", {},
      el("div", { class: "tables" }, table),
      failed ? el("p", { class: "note" }, `${failed} of ${book.entries.length} tickers failed and are left out of the hedge.`) : null),
  };
}

// The book's predicted risk (/api/portfolio/risk, asked with the button: it is priced per
// position): volatility before and after the L3 hedge, tracking error against a benchmark,
// and the Euler contributions by level and by position (they add up to the volatility).
function riskSection(book) {
  const bench = el("input", { id: "risk-benchmark", value: "SPY", size: 6, "aria-label": "Benchmark ticker" });
  const out = el("div", { id: "portfolio-risk" });
  const ask = async () => {
    out.replaceChildren(el("p", { class: "muted" }, "Computing the predicted risk\u2026"));
    const positions = Object.fromEntries(book.positions.filter((p) => p.dollars).map((p) => [p.ticker, p.dollars]));
    const body = { positions, units: "dollars", level: "L3" };
    if (bench.value.trim()) body.benchmark = bench.value.trim().toUpperCase();
    try {
      const doc = await state.client.post("/api/portfolio/risk", body);
      out.replaceChildren(...riskTables(book, doc));
    } catch (err) {
      showProblem(out, err, ask);
    }
  };
  return {
    node: el("div", { class: "risk" },
      el("div", { class: "controls" },
        el("label", {}, "Benchmark ", bench),
        button("Predicted risk", ask, { id: "predict-risk" })),
      out),
  };
}

function riskTables(book, doc) {
  const p = doc.portfolio;
  const annual = Math.sqrt(252);
  const pct = (usd) => (book.basis ? fmtPct(usd / book.basis) : "");
  const stat = (label, usd, name) => el("div", { class: "stat", dataset: { metric: name, value: String(usd) } },
    el("span", { class: "muted" }, label), el("b", {}, `${fmtUsd(usd)} ${pct(usd)}`));
  const te = doc.tracking_error;
  const stats = el("div", { class: "stats", id: "risk-stats" },
    stat("Predicted volatility (1 year)", p.vol_annual, "vol_annual"),
    stat("After the L3 hedge", doc.hedge.vol_after_annual, "vol_after_annual"),
    // What the ETF hedge leaves, split: the style factors' part and the specific part.
    doc.hedge.after ? stat("Left by the hedge: style", (doc.hedge.after.style || 0) * annual, "after_style_annual") : null,
    doc.hedge.after ? stat("Left by the hedge: specific", (doc.hedge.after.specific || 0) * annual, "after_specific_annual") : null,
    te ? stat("Tracking error (1 year)", te.vol_annual, "tracking_error_annual") : null);
  const rows = (items, name) => items.map((x) => el("tr", { dataset: { name: x[name], contribution: String(x.contribution) } },
    el("th", { scope: "row" }, x[name]), el("td", {}, fmtUsd(x.contribution * annual)), el("td", {}, fmtPct(x.share))));
  const levels = Object.entries(p.by_level).map(([level, c]) => ({ level, contribution: c, share: p.vol_daily ? c / p.vol_daily : 0 }));
  const table = (id, caption, head, body) => el("table", { class: "grid", id },
    el("caption", {}, caption),
    el("thead", {}, el("tr", {}, [head, "Contribution (1 year)", "Share"].map((h) => el("th", { scope: "col" }, h)))),
    el("tbody", {}, body));
  const unused = doc.unused.length
    ? el("p", { class: "note" }, `Not used: ${doc.unused.map((u) => `${u.ticker} (${u.reason})`).join(", ")}.`)
    : null;
  // Below the threshold (doc.partial) the figures describe part of the book only: say so.
  const partial = doc.partial
    ? el("p", { class: "note warn", id: "risk-partial", dataset: { usedShare: String(doc.used_share) } },
      `Partial answer: the risk model used ${fmtPct(doc.used_share)} of the book's gross size; the figures leave the rest out.`)
    : null;
  // A position that is neither a stock nor a factor (QQQ, TLT ...) is modelled on SPY alone.
  const notes = (doc.notes || []).length
    ? el("ul", { class: "note warn", id: "risk-notes" }, doc.notes.map((n) => el("li", {}, n)))
    : null;
  return [partial, stats,
    el("div", { class: "tables" },
      table("risk-by-level", "Risk by level", "Level", rows(levels, "level")),
      table("risk-by-position", "Risk by position", "Ticker", rows(p.positions, "ticker"))),
    notes, unused].filter(Boolean);
}

export const SECTIONS = [hedgeSection, riskSection, chartsSection, positionsSection];

function renderBook(out, book) {
  const parts = SECTIONS.map((section) => section(book));
  out.replaceChildren(...parts.map((p) => p.node));
  for (const p of parts) if (p.draw) p.draw();
}

// ----------------------------------------------------------------------------- the page

export function portfolioPage(view, params) {
  const units = params.get("units") === "usd" ? "usd" : "pct";
  const positions = parsePositions(params.get("p") || (params.has("p") ? "" : DEFAULT_POSITIONS));
  const value = Number(params.get("value")) || DEFAULT_VALUE;
  const signal = viewSignal();
  const rowsBody = el("tbody", { id: "positions" });
  const amountHead = el("th", {});
  const unitsSel = el("select", { id: "portfolio-units", "aria-label": "Positions in" },
    Object.entries(UNITS).map(([k, label]) => el("option", { value: k, selected: k === units }, label)));
  const valueInput = el("input", { id: "portfolio-value", type: "number", min: "0", step: "any", value, "aria-label": "Portfolio value in USD" });
  const valueLabel = el("label", {}, "Portfolio value (USD) ", valueInput);
  const addRow = (ticker, amount) => {
    const tr = el("tr", {},
      el("td", {}, el("input", { class: "pos-ticker", value: ticker, "aria-label": "Ticker", autocomplete: "off", size: 8 })),
      el("td", {}, el("input", { class: "pos-amount", type: "number", step: "any", value: Number.isFinite(amount) ? amount : "", "aria-label": "Position", size: 8 })),
      el("td", {}, button("\u00d7", () => tr.remove(), { title: "Remove", class: "icon" })),
    );
    rowsBody.append(tr);
  };
  positions.forEach((p) => addRow(p.ticker, p.amount));
  // The form as it stands, merged per ticker.
  const current = () => {
    const merged = new Map();
    for (const tr of rowsBody.querySelectorAll("tr")) {
      const t = tr.querySelector(".pos-ticker").value.trim().toUpperCase();
      const a = Number(tr.querySelector(".pos-amount").value);
      if (!t) continue;
      merged.set(t, (merged.get(t) || 0) + (Number.isFinite(a) ? a : 0));
    }
    return [...merged].map(([ticker, amount]) => ({ ticker, amount }));
  };
  const showUnits = () => {
    const usd = unitsSel.value === "usd";
    amountHead.textContent = usd ? "Position USD" : "Weight %";
    valueLabel.hidden = usd;
  };
  // Switching units rewrites the amounts so that the book stays the same (percent of the value
  // to dollars; dollars to percent of their gross, which becomes the value).
  unitsSel.addEventListener("change", () => {
    const inputs = [...rowsBody.querySelectorAll(".pos-amount")];
    const amounts = inputs.map((input) => Number(input.value) || 0);
    if (unitsSel.value === "usd") {
      const v = Number(valueInput.value) || DEFAULT_VALUE;
      inputs.forEach((input, i) => { input.value = String(Math.round(amounts[i] * v) / 100); });
    } else {
      const gross = amounts.reduce((s, a) => s + Math.abs(a), 0) || DEFAULT_VALUE;
      valueInput.value = String(gross);
      inputs.forEach((input, i) => { input.value = String(Math.round((amounts[i] / gross) * 1e6) / 1e4); });
    }
    showUnits();
  });
  showUnits();
  const body = (list) => ({ tickers: list.map((p) => p.ticker), metrics: ["full_metrics"], years: 1 });
  const cost = costLine(() => [{ endpoint: "batch/analyze", params: body(current()), label: `${current().length} positions` }]);
  const analyze = button("Analyze", () => {
    const p = current().map((x) => `${x.ticker}:${x.amount}`).join(",");
    const tail = unitsSel.value === "usd" ? "&units=usd" : `&value=${Number(valueInput.value) || 0}`;
    go(`#/portfolio?p=${encodeURIComponent(p)}${tail}`);
  }, { id: "analyze", class: "primary" });
  const out = el("section", { id: "portfolio-out" });
  view.append(
    el("div", { class: "page-head" },
      el("h1", {}, "Portfolio"),
      el("p", { class: "lede" }, "Positions in dollars, or in percent of the portfolio value (negative for a short). The hedge is each position's L3 hedge ratios times its dollars, summed per ETF."),
    ),
    el("div", { class: "portfolio-form" },
      el("table", { class: "grid compact" }, el("thead", {}, el("tr", {}, el("th", {}, "Ticker"), amountHead, el("th", {}))), rowsBody),
      el("div", { class: "controls" },
        button("Add position", () => addRow("", 0)),
        el("label", {}, "Positions in ", unitsSel),
        valueLabel,
        analyze,
        cost.node,
      ),
    ),
    out,
  );
  rowsBody.addEventListener("change", cost.refresh);
  if (!positions.length) return;

  const fetchIt = async () => {
    out.replaceChildren(el("p", { class: "muted" }, "Analyzing\u2026"));
    try {
      const doc = await state.client.post("/api/batch/analyze", body(positions), signal);
      showMetadata(doc._metadata);
      renderBook(out, makeBook(positions, units, value, readBatch(doc)));
    } catch (err) {
      showProblem(out, err, fetchIt);
    }
  };
  fetchIt();
}

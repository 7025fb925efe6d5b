// The eqrisk dashboard: market treemap, stock page, portfolio hedge, account strip.
// One more client of the public API (same routes, same keys); the key stays in this browser.

import { readBatch, readMetrics } from "./adapt.js";
import { ApiProblem, Client } from "./api.js";
import * as charts from "./charts.js";
import { debounce, el, fmtCredit, fmtNum, fmtPct, fmtUsd } from "./format.js";

const KEY_STORE = "eqrisk.apiKey";
const DEMO_KEY = document.querySelector('meta[name="eqrisk-demo-key"]').content;
const YEARS = [1, 2, 3, 5, 10];
const HEATMAP_SIZES = [25, 50, 100, 200, 500];
const DEFAULT_HEATMAP = 100;
const DEFAULT_PORTFOLIO = "AAPL:40,MSFT:30,NVDA:30";
const SEARCH_LIMIT = 10; // what /api/tickers?search= answers at most

const state = {
  key: null,
  client: null,
  isDemo: false,
  account: null, // the /api/balance answer (real keys)
  accountError: null, // why /api/balance failed: kept, so a later meter update cannot erase it
  usage: { requests: 0, usd: 0 },
  rate: { limit: null, remaining: null, reset: null },
  metadata: null,
  page: null,
};

const $ = (selector) => document.querySelector(selector);

// ----------------------------------------------------------------------------- layer colours

function applyLayerColours() {
  for (const [name, layer] of Object.entries(charts.LAYERS)) {
    document.documentElement.style.setProperty(`--layer-${name}`, layer.color);
  }
}

// ----------------------------------------------------------------------------- key

function storedKey() {
  try {
    return localStorage.getItem(KEY_STORE);
  } catch (_) {
    return null;
  }
}

function useKey(key, remember) {
  state.key = key;
  state.isDemo = key === DEMO_KEY;
  state.account = null;
  state.accountError = null;
  state.usage = { requests: 0, usd: 0 };
  state.rate = { limit: null, remaining: null, reset: null };
  state.client = new Client(key, onMeter);
  try {
    if (remember) localStorage.setItem(KEY_STORE, key);
    else localStorage.removeItem(KEY_STORE);
  } catch (_) {
    /* storage disabled: the key lives for this page only */
  }
  renderStrip();
  if (!state.isDemo) loadAccount();
  route();
}

function forgetKey() {
  try {
    localStorage.removeItem(KEY_STORE);
  } catch (_) {
    /* nothing stored */
  }
  state.key = null;
  state.client = null;
  state.accountError = null;
  renderStrip();
  askForKey();
}

function askForKey(message) {
  const dialog = $("#key-dialog");
  $("#key-message").textContent = message || "";
  $("#key-input").value = state.key && !state.isDemo ? state.key : "";
  if (!dialog.open) dialog.showModal();
  $("#key-input").focus();
}

function wireKeyDialog() {
  $("#demo-key-value").textContent = DEMO_KEY;
  $("#key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const key = $("#key-input").value.trim();
    if (!key) {
      $("#key-message").textContent = "Paste your API key, or use the demo key.";
      return;
    }
    $("#key-dialog").close();
    useKey(key, $("#key-remember").checked);
  });
  $("#use-demo").addEventListener("click", () => {
    $("#key-dialog").close();
    useKey(DEMO_KEY, $("#key-remember").checked);
  });
}

// ----------------------------------------------------------------------------- account strip

async function loadAccount() {
  const client = state.client;
  try {
    const doc = await client.get("/api/balance");
    if (client !== state.client) return;
    state.account = doc;
    state.accountError = null;
    state.usage = { requests: doc.usage_this_month.requests, usd: doc.usage_this_month.usd };
    renderStrip();
  } catch (err) {
    if (client !== state.client) return;
    state.accountError = err;
    renderStrip();
  }
}

function onMeter(m) {
  if (m.limit !== null) {
    state.rate = { limit: m.limit, remaining: m.remaining, reset: m.reset };
  }
  if (!state.isDemo && m.costUsd !== null && m.costUsd > 0) {
    state.usage.requests += 1;
    state.usage.usd += m.costUsd;
  }
  if (!state.isDemo && state.account && m.balanceUsd !== null && m.status < 300) {
    state.account.balance_usd = m.balanceUsd;
  }
  renderStrip();
}

let stripTimer = null;

function renderStrip() {
  const error = state.accountError;
  const strip = $("#account");
  strip.replaceChildren();
  clearTimeout(stripTimer);
  if (!state.key) {
    strip.append(el("span", { class: "muted" }, "No API key yet."), button("Enter a key", () => askForKey()));
    return;
  }
  const items = [];
  if (state.isDemo) {
    items.push(
      item("Key", "demo key"),
      item("Covers", "AAPL MSFT GOOGL AMZN NVDA META TSLA"),
      item("Cost", "not charged"),
    );
  } else if (state.account) {
    const a = state.account;
    items.push(
      item("Key", a.key_id),
      item("Account", `${a.account_id} (${a.state})`),
      item("Balance", fmtCredit(a.balance_usd), "balance"),
      item("This month", `${state.usage.requests} paid requests, ${fmtCredit(state.usage.usd)}`, "usage"),
    );
  } else if (error) {
    items.push(item("Key", "not accepted"));
  } else {
    items.push(item("Key", "checking\u2026"));
  }
  const r = state.rate;
  if (r.limit !== null) {
    let text = `${r.remaining} of ${r.limit} left`;
    const wait = r.reset ? Math.max(0, Math.ceil(r.reset - Date.now() / 1000)) : 0;
    if (r.remaining === 0 && wait > 0) {
      text += `, next in ${wait} s`;
      stripTimer = setTimeout(renderStrip, 1000);
    }
    items.push(item("Requests", text, "rate"));
  }
  strip.append(...items);
  strip.append(
    el("span", { class: "strip-actions" }, button("Change key", () => askForKey()), button("Forget key", forgetKey)),
  );
  if (error) strip.append(problemPanel(error, loadAccount, "strip-error"));
}

function item(label, value, name) {
  return el("span", { class: "strip-item", dataset: name ? { item: name } : undefined }, el("b", {}, label), " ", value);
}

function button(text, onclick, attrs) {
  return el("button", { type: "button", onclick, ...(attrs || {}) }, text);
}

// ----------------------------------------------------------------------------- metadata line

function showMetadata(meta) {
  if (!meta) return;
  state.metadata = meta;
  const line = $("#dataline");
  line.replaceChildren(
    el("span", {}, "Data as of ", el("b", { id: "data-as-of" }, meta.data_as_of || "\u2014")),
    el("span", {}, "Model ", el("b", { id: "model-version" }, meta.model_version)),
    el("span", {}, `${meta.universe_size} symbols, ${meta.data_source}`),
    ...(meta.method ? [el("span", { class: "muted" }, `window ${meta.method.window}, ${meta.method.weighting}`)] : []),
  );
}

// ----------------------------------------------------------------------------- errors

// An error answer shown in place of what it stops: what went wrong, and what to do.
function problemPanel(err, retry, extraClass) {
  const p = err.problem || {};
  const panel = el("div", { class: `problem ${extraClass || ""}`, role: "alert", dataset: { status: err.status, code: err.code } });
  const head = el("p", { class: "problem-title" });
  const body = el("p", { class: "problem-detail" });
  const actions = el("p", { class: "problem-actions" });
  switch (err.status) {
    case 401:
      head.textContent = "Your API key was not accepted (401)";
      body.textContent = `${err.message}. Enter a valid key or use the demo key.`;
      actions.append(button("Change key", () => askForKey()));
      break;
    case 402:
      head.textContent = "Not enough credit (402)";
      body.textContent =
        `This view costs ${fmtCredit(p.required_usd)} and the balance is ${fmtCredit(p.balance_usd)}. ` +
        "Top up the account, or pick a smaller view.";
      break;
    case 403:
      if (err.code === "DEMO_RESTRICTED") {
        head.textContent = "Not available with the demo key (403)";
        body.textContent = `${err.message}. A key of your own covers the whole market.`;
        if (p.allowed_tickers) {
          actions.append(
            ...p.allowed_tickers.map((t) => el("a", { class: "chip", href: `#/stock/${encodeURIComponent(t)}` }, t)),
          );
        }
        actions.append(button("Use my own key", () => askForKey()));
      } else {
        head.textContent = `Not allowed (403 ${err.code})`;
        body.textContent = err.message;
      }
      break;
    case 404:
      head.textContent = err.code === "TICKER_NOT_FOUND" ? "Unknown ticker (404)" : `Not found (404 ${err.code})`;
      body.textContent = err.message;
      for (const t of p.suggestions || []) {
        actions.append(el("a", { class: "chip", href: `#/stock/${encodeURIComponent(t)}` }, t));
      }
      break;
    case 429: {
      head.textContent = "Too many requests (429)";
      const wait = el("b", { class: "retry-wait" }, `${err.retryAfter ?? "?"} s`);
      body.append(`${err.message}. `, "Wait ", wait, " and try again.");
      if (retry) {
        const again = button("Try again", retry, { disabled: true, class: "retry" });
        actions.append(again);
        let left = err.retryAfter ?? 0;
        const tick = () => {
          if (!panel.isConnected) return;
          if (left <= 0) {
            again.disabled = false;
            wait.textContent = "0 s";
            return;
          }
          wait.textContent = `${left} s`;
          left -= 1;
          setTimeout(tick, 1000);
        };
        tick();
      }
      break;
    }
    case 0:
      head.textContent = "No answer from the server";
      body.textContent = err.message;
      if (retry) actions.append(button("Try again", retry));
      break;
    default:
      head.textContent = `The request failed (${err.status} ${err.code})`;
      body.textContent = err.message;
      if (retry) actions.append(button("Try again", retry));
  }
  panel.append(head, body);
  if (actions.childNodes.length) panel.append(actions);
  if (p.request_id) panel.append(el("p", { class: "muted small" }, `Request id ${p.request_id}`));
  return panel;
}

function showProblem(container, err, retry) {
  if (!(err instanceof ApiProblem)) throw err;
  for (const div of container.querySelectorAll(".chart")) charts.purge(div);
  container.replaceChildren(problemPanel(err, retry));
}

// ----------------------------------------------------------------------------- cost

// "Cost of this view": the estimate is fetched only when the visitor asks for it (it is free
// but counts toward the rate limit), for the view's calls as the controls stand.
function costLine(calls) {
  const out = el("span", { class: "cost-text", "aria-live": "polite" });
  let shown = false;
  const refresh = async () => {
    if (!shown) return;
    if (state.isDemo) {
      out.textContent = "Demo key: not charged (counts toward its 5 requests a minute).";
      return;
    }
    const client = state.client;
    out.textContent = "estimating\u2026";
    try {
      const list = calls();
      const answers = await Promise.all(list.map((c) => client.post("/api/estimate", { endpoint: c.endpoint, params: c.params })));
      const total = answers.reduce((s, a) => s + a.estimated_cost_usd, 0);
      const parts = answers.map((a, i) => `${list[i].label} ${fmtCredit(a.estimated_cost_usd)} (${a.estimated_rows} rows)`);
      out.textContent = `${fmtCredit(total)}: ${parts.join(" + ")}`;
      out.dataset.usd = String(total);
    } catch (err) {
      out.replaceChildren(problemPanel(err, refresh, "inline"));
    }
  };
  const toggle = button("Cost?", () => {
    shown = !shown;
    toggle.setAttribute("aria-pressed", String(shown));
    if (shown) refresh();
    else out.textContent = "";
  }, { class: "cost-button", "aria-pressed": "false", title: "What this view costs before it is fetched" });
  return { node: el("span", { class: "cost" }, toggle, out), refresh };
}

// ----------------------------------------------------------------------------- routing

function parseHash() {
  const raw = location.hash.replace(/^#\/?/, "");
  const [path, qs] = raw.split("?");
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  return { page: parts[0] || "market", arg: parts[1] || null, params: new URLSearchParams(qs || "") };
}

function go(hash) {
  if (location.hash === hash) route();
  else location.hash = hash;
}

function route() {
  const { page, arg, params } = parseHash();
  for (const link of document.querySelectorAll("nav a")) {
    link.classList.toggle("active", link.dataset.page === page);
  }
  const view = $("#view");
  for (const div of view.querySelectorAll(".chart")) charts.purge(div);
  view.replaceChildren();
  state.page = page;
  if (!state.client) {
    view.append(el("p", { class: "empty" }, "Enter an API key (or use the demo key) to see the data."));
    return;
  }
  if (page === "stock") stockPage(view, arg, params);
  else if (page === "portfolio") portfolioPage(view, params);
  else marketPage(view, params);
}

// ----------------------------------------------------------------------------- market page

function marketPage(view, params) {
  const limit = Number(params.get("limit")) || DEFAULT_HEATMAP;
  const sizes = el("select", { id: "heatmap-limit", "aria-label": "Number of stocks" },
    HEATMAP_SIZES.map((n) => el("option", { value: n, selected: n === limit }, `${n} largest`)));
  const cost = costLine(() => [{ endpoint: "heatmap", params: { limit: Number(sizes.value) }, label: "heatmap" }]);
  sizes.addEventListener("change", cost.refresh);
  const load = button("Show", () => go(`#/market?limit=${sizes.value}`));
  const note = el("p", { class: "note", id: "market-note" });
  const area = el("div", { class: "chart-area" });
  view.append(
    el("div", { class: "page-head" },
      el("h1", {}, "Market"),
      el("p", { class: "lede" }, "Largest stocks by market cap, coloured by their latest daily return, grouped by sector. Click a stock to open it, a sector to zoom in."),
    ),
    el("div", { class: "controls" }, state.isDemo ? null : sizes, state.isDemo ? null : load, cost.node),
    area,
    note,
  );
  const fetchIt = async () => {
    area.replaceChildren(el("div", { class: "chart tall", id: "treemap", "aria-label": "Market treemap" }));
    try {
      const doc = await state.client.get("/api/heatmap", { limit });
      showMetadata(doc._metadata);
      if (!doc.data.length) {
        area.replaceChildren(el("p", { class: "empty" }, doc.meta.note || "No stock to show."));
        return;
      }
      const div = $("#treemap");
      div.dataset.rows = String(doc.data.length);
      charts.treemap(div, doc.data, (ticker) => go(`#/stock/${encodeURIComponent(ticker)}`));
      const restricted = doc.meta.restricted_to;
      note.textContent = restricted
        ? `Demo key: the ${doc.data.length} demo tickers only (${restricted.join(", ")}). A key of your own shows the whole market.`
        : `${doc.data.length} of ${doc.meta.eligible} stocks priced in the last sessions; returns as of ${doc.data[0].teo}.`;
    } catch (err) {
      showProblem(area, err, fetchIt);
    }
  };
  fetchIt();
}

// ----------------------------------------------------------------------------- search

function wireSearch() {
  const input = $("#search-input");
  const list = $("#suggestions");
  const cache = new Map(); // "key|demo|query" -> results (complete when fewer than the limit)
  let active = -1;
  let shown = [];

  const close = () => {
    list.hidden = true;
    list.replaceChildren();
    active = -1;
    input.setAttribute("aria-expanded", "false");
  };
  const open = (ticker) => {
    close();
    input.value = "";
    input.blur();
    go(`#/stock/${encodeURIComponent(ticker)}`);
  };
  const render = (results) => {
    shown = results;
    active = -1;
    list.replaceChildren(
      ...results.map((r, i) =>
        el("li", { role: "option", id: `suggestion-${i}`, dataset: { ticker: r.ticker }, onmousedown: (e) => { e.preventDefault(); open(r.ticker); } },
          el("b", {}, r.ticker), " ", el("span", {}, r.company_name || ""), " ", el("span", { class: "muted small" }, r.asset_type === "etf" ? "ETF" : r.sector || "")),
      ),
    );
    if (!results.length) list.append(el("li", { class: "muted" }, "No match"));
    list.hidden = false;
    input.setAttribute("aria-expanded", "true");
  };
  // A longer query matches a subset of a shorter one (symbol prefix, name substring): when the
  // shorter query's answer was complete, filter it here instead of asking again.
  const local = (scope, query) => {
    for (let n = query.length - 1; n >= 1; n -= 1) {
      const prior = cache.get(`${scope}|${query.slice(0, n)}`);
      if (prior && prior.length < SEARCH_LIMIT) {
        const upper = query.toUpperCase();
        const lower = query.toLowerCase();
        const tier = (r) => {
          const name = (r.company_name || "").toLowerCase();
          if (r.ticker === upper) return 0;
          if (r.ticker.startsWith(upper)) return 1;
          if (name.startsWith(lower) || name.includes(` ${lower}`)) return 2;
          return name.includes(lower) ? 3 : 9;
        };
        return prior.filter((r) => tier(r) < 9).sort((a, b) => tier(a) - tier(b));
      }
    }
    return null;
  };
  const lookup = debounce(async (query) => {
    if (!state.client || query !== input.value.trim() || !query) return;
    const scope = `${state.key}|${state.isDemo}`;
    let results = cache.get(`${scope}|${query}`) || local(scope, query);
    if (!results) {
      try {
        const params = { search: query };
        if (state.isDemo) params.mag7 = "true";
        results = (await state.client.get("/api/tickers", params)).results;
      } catch (err) {
        list.replaceChildren(el("li", { class: "problem-inline" }, problemPanel(err, () => lookup(query))));
        list.hidden = false;
        return;
      }
    }
    cache.set(`${scope}|${query}`, results);
    if (query === input.value.trim()) render(results);
  }, 250);

  input.addEventListener("input", () => {
    const query = input.value.trim();
    if (!query) close();
    else lookup(query);
  });
  input.addEventListener("keydown", (event) => {
    const items = list.querySelectorAll("li[role=option]");
    if (event.key === "ArrowDown" || event.key === "ArrowUp") {
      event.preventDefault();
      if (!items.length) return;
      active = (active + (event.key === "ArrowDown" ? 1 : items.length - 1)) % items.length;
      items.forEach((li, i) => li.classList.toggle("active", i === active));
      input.setAttribute("aria-activedescendant", items[active].id);
    } else if (event.key === "Escape") {
      close();
    }
  });
  $("#search").addEventListener("submit", (event) => {
    event.preventDefault();
    const query = input.value.trim().toUpperCase();
    if (active >= 0 && shown[active]) open(shown[active].ticker);
    else if (query) open((shown.find((r) => r.ticker === query) || { ticker: query }).ticker);
  });
  input.addEventListener("blur", () => setTimeout(close, 150));
}

// ----------------------------------------------------------------------------- stock page

function stockPage(view, ticker, params) {
  if (!ticker) {
    view.append(
      el("div", { class: "page-head" }, el("h1", {}, "Stock"), el("p", { class: "lede" }, "Search for a ticker or a company name above.")),
      ...(state.isDemo
        ? [el("p", { class: "chips" }, "The demo key covers: ", ...["AAPL", "MSFT", "GOOGL", "AMZN", "NVDA", "META", "TSLA"].map((t) => el("a", { class: "chip", href: `#/stock/${t}` }, t)))]
        : []),
    );
    return;
  }
  ticker = ticker.toUpperCase();
  const years = YEARS.includes(Number(params.get("years"))) ? Number(params.get("years")) : 3;
  const level = [1, 2, 3].includes(Number(params.get("level"))) ? Number(params.get("level")) : 3;
  const yearsSel = el("select", { id: "years", "aria-label": "Years of history" }, YEARS.map((y) => el("option", { value: y, selected: y === years }, `${y} ${y === 1 ? "year" : "years"}`)));
  const levelSel = el("select", { id: "level", "aria-label": "Hedge level" }, [1, 2, 3].map((k) => el("option", { value: k, selected: k === level }, charts.LEVELS[k].name)));
  const fmtSel = el("select", { id: "download-format", "aria-label": "Download format" }, el("option", { value: "csv" }, "CSV"), el("option", { value: "parquet" }, "Parquet"));
  const viewCalls = () => [
    { endpoint: `metrics/${ticker}`, params: {}, label: "snapshot" },
    { endpoint: "ticker-returns", params: { ticker, years: Number(yearsSel.value) }, label: `${yearsSel.value} y of returns` },
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
      const file = await state.client.download("/api/ticker-returns", { ticker, years: Number(yearsSel.value), format: fmtSel.value });
      const url = URL.createObjectURL(file.blob);
      const a = el("a", { href: url, download: file.filename });
      document.body.append(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 10000);
      downloadOut.textContent = `${file.filename} (${Math.round(file.blob.size / 1024)} kB)`;
    } catch (err) {
      downloadOut.replaceChildren(problemPanel(err, null, "inline"));
    }
  }, { id: "download" });

  const head = el("div", { class: "page-head" }, el("h1", { id: "stock-title" }, ticker));
  const snapshot = el("section", { class: "snapshot", id: "snapshot", "aria-label": "Latest snapshot" });
  const chartsArea = el("section", { class: "charts", id: "stock-charts" });
  view.append(
    head,
    el("div", { class: "controls" }, yearsSel, load, levelSel, cost.node),
    snapshot,
    chartsArea,
    el("div", { class: "controls download" }, el("span", {}, "Download these rows as"), fmtSel, download, downloadCost.node, downloadOut),
  );

  const fetchIt = async () => {
    snapshot.replaceChildren(el("p", { class: "muted" }, "Loading\u2026"));
    chartsArea.replaceChildren();
    let snap;
    try {
      // One at a time: a refused ticker (403, 404) costs the rate limit once, not twice.
      snap = readMetrics(await state.client.get(`/api/metrics/${encodeURIComponent(ticker)}`));
    } catch (err) {
      snapshot.replaceChildren();
      showProblem(chartsArea, err, fetchIt);
      return;
    }
    renderSnapshot(head, snapshot, snap);
    const cards = chartCards(chartsArea, level, years);
    try {
      const doc = await state.client.get("/api/ticker-returns", { ticker, years });
      showMetadata(doc._metadata);
      const rows = doc.data;
      if (!rows.length) {
        chartsArea.replaceChildren(el("p", { class: "empty" }, doc.meta.note || "No rows in this window."));
        return;
      }
      const etfs = { market: doc.meta.market_etf, sector: doc.meta.sector_etf, subsector: doc.meta.subsector_etf };
      for (const div of Object.values(cards)) div.dataset.rows = String(rows.length);
      charts.riskShares(cards.shares, rows, level);
      charts.hedgeRatios(cards.hedges, rows, level, etfs);
      charts.hedgedReturn(cards.returns, rows, level, ticker);
    } catch (err) {
      showProblem(chartsArea, err, fetchIt);
    }
  };
  fetchIt();
}

function chartCards(area, level, years) {
  const card = (id, title, caption) => {
    const div = el("div", { class: "chart", id });
    area.append(el("figure", { class: "card" }, el("figcaption", {}, el("b", {}, title), " ", el("span", { class: "muted" }, caption)), div));
    return div;
  };
  const span = `${years} ${years === 1 ? "year" : "years"}, L${level}`;
  return {
    shares: card("chart-shares", "Explained risk", `share of variance by layer (${span})`),
    hedges: card("chart-hedges", "Hedge ratios", `ETF dollars per $1 of stock (${span})`),
    returns: card("chart-returns", "Cumulative return", `stock vs hedged residual (${span})`),
  };
}

function renderSnapshot(head, section, snap) {
  const m = snap.metrics;
  const meta = snap.meta;
  head.replaceChildren(
    el("h1", { id: "stock-title" }, snap.ticker, " ", el("span", { class: "company" }, meta.company_name || "")),
    el("p", { class: "lede" }, [meta.sector, meta.industry].filter(Boolean).join(" \u00b7 ") || meta.asset_type || "",
      snap.teo ? el("span", { class: "muted" }, ` \u00b7 latest session ${snap.teo}`) : null),
  );
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

// ----------------------------------------------------------------------------- portfolio page

function parsePositions(text) {
  const out = [];
  for (const part of (text || "").split(",")) {
    const [t, w] = part.split(":");
    if (t && t.trim()) out.push({ ticker: t.trim().toUpperCase(), weight: Number(w) });
  }
  return out;
}

function portfolioPage(view, params) {
  const positions = parsePositions(params.get("p") || DEFAULT_PORTFOLIO);
  const value = Number(params.get("value")) || 1000000;
  const rowsBody = el("tbody", { id: "positions" });
  const addRow = (ticker, weight) => {
    const tr = el("tr", {},
      el("td", {}, el("input", { class: "pos-ticker", value: ticker, "aria-label": "Ticker", autocomplete: "off", size: 8 })),
      el("td", {}, el("input", { class: "pos-weight", type: "number", step: "any", value: Number.isFinite(weight) ? weight : "", "aria-label": "Weight in percent", size: 6 })),
      el("td", {}, button("\u00d7", () => tr.remove(), { title: "Remove", class: "icon" })),
    );
    rowsBody.append(tr);
  };
  positions.forEach((p) => addRow(p.ticker, p.weight));
  const valueInput = el("input", { id: "portfolio-value", type: "number", min: "0", step: "any", value, "aria-label": "Portfolio value in USD" });
  const current = () => {
    const merged = new Map();
    for (const tr of rowsBody.querySelectorAll("tr")) {
      const t = tr.querySelector(".pos-ticker").value.trim().toUpperCase();
      const w = Number(tr.querySelector(".pos-weight").value);
      if (!t) continue;
      merged.set(t, (merged.get(t) || 0) + (Number.isFinite(w) ? w : 0));
    }
    return [...merged].map(([ticker, weight]) => ({ ticker, weight }));
  };
  const body = (list) => ({ tickers: list.map((p) => p.ticker), metrics: ["full_metrics"], years: 1 });
  const cost = costLine(() => [{ endpoint: "batch/analyze", params: body(current()), label: `${current().length} positions` }]);
  const analyze = button("Analyze", () => {
    const list = current();
    const p = list.map((x) => `${x.ticker}:${x.weight}`).join(",");
    go(`#/portfolio?p=${encodeURIComponent(p)}&value=${Number(valueInput.value) || 0}`);
  }, { id: "analyze", class: "primary" });
  const out = el("section", { id: "portfolio-out" });
  view.append(
    el("div", { class: "page-head" },
      el("h1", {}, "Portfolio"),
      el("p", { class: "lede" }, "Weights in percent of the portfolio value (negative for a short). The hedge is each position's L3 hedge ratios times its weight, summed per ETF."),
    ),
    el("div", { class: "portfolio-form" },
      el("table", { class: "grid compact" }, el("thead", {}, el("tr", {}, el("th", {}, "Ticker"), el("th", {}, "Weight %"), el("th", {}))), rowsBody),
      el("div", { class: "controls" },
        button("Add position", () => addRow("", 0)),
        el("label", {}, "Portfolio value (USD) ", valueInput),
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
      const doc = await state.client.post("/api/batch/analyze", body(positions));
      showMetadata(doc._metadata);
      renderPortfolio(out, positions, readBatch(doc), value);
    } catch (err) {
      showProblem(out, err, fetchIt);
    }
  };
  fetchIt();
}

// The portfolio's hedge: per ETF, the sum of weight x hedge ratio over the positions that use it.
export function portfolioHedges(positions, entries) {
  const weight = new Map(positions.map((p) => [p.ticker, p.weight / 100]));
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
      const h = hedges.get(key) || { etf, layer, notional: 0, positions: [] };
      h.notional += (weight.get(e.ticker) || 0) * m[column];
      h.positions.push(e.ticker);
      hedges.set(key, h);
    }
  }
  const order = { market: 0, sector: 1, subsector: 2 };
  return [...hedges.values()].sort((a, b) => order[a.layer] - order[b.layer] || a.etf.localeCompare(b.etf));
}

function renderPortfolio(out, positions, entries, value) {
  const weight = new Map(positions.map((p) => [p.ticker, p.weight]));
  const ok = entries.filter((e) => e.ok);
  const hedges = portfolioHedges(positions, entries);
  const cell = (v, fmt, name) => el("td", { dataset: { metric: name, value: v ?? "" } }, fmt(v));
  const posTable = el("table", { class: "grid", id: "position-table" },
    el("caption", {}, "Positions: L3 hedge ratios and explained-risk shares"),
    el("thead", {}, el("tr", {},
      ["Ticker", "Weight", "Market HR", "Sector HR", "Subsector HR"].map((h) => el("th", { scope: "col" }, h)),
      ["market", "sector", "subsector", "residual"].map((layer) => el("th", { scope: "col" }, el("i", { class: `swatch ${layer}` }), charts.LAYERS[layer].label)),
    )),
    el("tbody", {}, entries.map((e) => {
      if (!e.ok) {
        return el("tr", { class: "error-row", dataset: { ticker: e.ticker } }, el("th", { scope: "row" }, e.ticker), el("td", { colspan: 8 }, `${e.error.code}: ${e.error.detail}`));
      }
      const m = e.snapshot.metrics;
      const meta = e.snapshot.meta;
      return el("tr", { dataset: { ticker: e.ticker } },
        el("th", { scope: "row" }, el("a", { href: `#/stock/${encodeURIComponent(e.ticker)}` }, e.ticker)),
        el("td", {}, `${fmtNum(weight.get(e.ticker), 1)}%`),
        cell(m.l3_mkt_hr, (v) => `${fmtNum(v, 3)} ${meta.market_etf || ""}`, "l3_mkt_hr"),
        cell(m.l3_sec_hr, (v) => `${fmtNum(v, 3)} ${meta.sector_etf || ""}`, "l3_sec_hr"),
        cell(m.l3_sub_hr, (v) => (meta.subsector_etf ? `${fmtNum(v, 3)} ${meta.subsector_etf}` : "\u2014"), "l3_sub_hr"),
        cell(m.l3_mkt_er, fmtPct, "l3_mkt_er"),
        cell(m.l3_sec_er, fmtPct, "l3_sec_er"),
        cell(m.l3_sub_er, fmtPct, "l3_sub_er"),
        cell(m.l3_res_er, fmtPct, "l3_res_er"),
      );
    })),
  );
  const hedgeTable = el("table", { class: "grid", id: "hedge-notional" },
    el("caption", {}, `The portfolio's hedge (value ${fmtUsd(value)})`),
    el("thead", {}, el("tr", {}, ["ETF", "To neutralise", "Per $1", "Layer", "From"].map((h) => el("th", { scope: "col" }, h)))),
    el("tbody", {}, hedges.map((h) => el("tr", { dataset: { etf: h.etf, layer: h.layer, notional: String(h.notional) } },
      el("th", { scope: "row" }, h.etf),
      el("td", { class: h.notional >= 0 ? "sell" : "buy" }, `${h.notional >= 0 ? "Sell" : "Buy"} ${fmtUsd(Math.abs(h.notional * value))}`),
      el("td", {}, fmtNum(h.notional, 4)),
      el("td", {}, el("i", { class: `swatch ${h.layer}` }), charts.LAYERS[h.layer].label),
      el("td", { class: "muted" }, h.positions.join(", ")),
    ))),
  );
  const hedgeChart = el("div", { class: "chart short", id: "chart-portfolio-hedge", dataset: { rows: String(hedges.length) } });
  const shareChart = el("div", { class: "chart short", id: "chart-position-shares", dataset: { rows: String(ok.length) } });
  const failed = entries.length - ok.length;
  out.replaceChildren(
    el("div", { class: "tables" }, hedgeTable),
    el("div", { class: "charts two" },
      el("figure", { class: "card" }, el("figcaption", {}, el("b", {}, "Hedge notional per ETF"), el("span", { class: "muted" }, " per $1 of portfolio; positive = sell")), hedgeChart),
      el("figure", { class: "card" }, el("figcaption", {}, el("b", {}, "Explained risk by position"), el("span", { class: "muted" }, " L3 shares of variance")), shareChart),
    ),
    el("div", { class: "tables" }, posTable),
    ...(failed ? [el("p", { class: "note" }, `${failed} of ${entries.length} tickers failed and are left out of the hedge.`)] : []),
  );
  charts.portfolioHedge(hedgeChart, hedges);
  charts.positionShares(shareChart, ok.map((e) => ({ ticker: e.ticker, metrics: e.snapshot.metrics })));
}

// ----------------------------------------------------------------------------- start

function start() {
  applyLayerColours();
  wireKeyDialog();
  wireSearch();
  window.addEventListener("hashchange", route);
  const key = storedKey();
  if (key) useKey(key, true);
  else {
    renderStrip();
    route();
    askForKey();
  }
}

start();

// The eqrisk dashboard: market treemap, stock page, portfolio hedge, account strip.
// One more client of the public API (same routes, same keys); the key stays in this browser.
// This module starts the page and routes the hash to a page module (market, stock, portfolio).

import { wireAccount } from "./account.js";
import * as charts from "./charts.js";
import { el } from "./format.js";
import { marketPage } from "./market.js";
import { portfolioPage } from "./portfolio.js";
import { wireSearch } from "./search.js";
import { $, state } from "./state.js";
import { stockPage } from "./stock.js";
import { purgeCharts } from "./ui.js";

function applyLayerColours() {
  for (const [name, layer] of Object.entries(charts.LAYERS)) {
    document.documentElement.style.setProperty(`--layer-${name}`, layer.color);
  }
}

function parseHash() {
  const raw = location.hash.replace(/^#\/?/, "");
  const [path, qs] = raw.split("?");
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  return { page: parts[0] || "market", arg: parts[1] || null, params: new URLSearchParams(qs || "") };
}

// Draw the page the hash names. The view left behind cancels its requests still waiting for
// the rate limit, so that they do not spend the new view's requests.
function route() {
  const { page, arg, params } = parseHash();
  for (const link of document.querySelectorAll("nav a")) {
    link.classList.toggle("active", link.dataset.page === page);
  }
  if (state.view) state.view.abort();
  state.view = new AbortController();
  const view = $("#view");
  purgeCharts(view);
  view.replaceChildren();
  state.page = page;
  if (!state.client) {
    view.append(el("p", { class: "empty" }, "Enter an API key (or use a key the page offers) to see the data."));
    return;
  }
  if (page === "stock") stockPage(view, arg, params);
  else if (page === "portfolio") portfolioPage(view, params);
  else marketPage(view, params);
}

function start() {
  applyLayerColours();
  wireSearch();
  window.addEventListener("hashchange", route);
  wireAccount(route);
}

start();

// The search box: suggestions from /api/tickers?search=, asked once per query (a longer query
// is filtered from a shorter one's complete answer instead of asked again).

import { el, debounce } from "./format.js";
import { $, go, state } from "./state.js";
import { isCancelled, problemPanel } from "./ui.js";

const SEARCH_LIMIT = 10; // what /api/tickers?search= answers at most

export function wireSearch() {
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
        if (isCancelled(err)) return;
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

// The market page: a treemap of the largest stocks (one request: /api/heatmap), stale stocks
// marked on it and listed under it.

import { readHeatmap } from "./adapt.js";
import * as charts from "./charts.js";
import { el } from "./format.js";
import { go, state, viewSignal } from "./state.js";
import { button, costLine, showMetadata, showProblem, staleBadge } from "./ui.js";

const HEATMAP_SIZES = [25, 50, 100, 200, 500];
const DEFAULT_HEATMAP = 100;

// The stale stocks of the map, each with its badge and a link to its page.
function staleList(rows, dataAsOf) {
  const stale = rows.filter((r) => r.staleness.stale);
  if (!stale.length) return null;
  return el("section", { class: "stale-list", id: "stale-list", "aria-label": "Stale stocks" },
    el("p", { class: "note" }, `Not priced on the data date (${dataAsOf}); their values are from their last session:`),
    el("ul", {}, stale.map((r) => el("li", { dataset: { ticker: r.ticker } },
      el("a", { href: `#/stock/${encodeURIComponent(r.ticker)}` }, r.ticker), " ",
      el("span", { class: "muted" }, r.company_name || ""), " ", staleBadge(r.staleness, r.ticker)))));
}

export function marketPage(view, params) {
  const limit = Number(params.get("limit")) || DEFAULT_HEATMAP;
  const sizes = el("select", { id: "heatmap-limit", "aria-label": "Number of stocks" },
    HEATMAP_SIZES.map((n) => el("option", { value: n, selected: n === limit }, `${n} largest`)));
  const cost = costLine(() => [{ endpoint: "heatmap", params: { limit: Number(sizes.value) }, label: "heatmap" }]);
  sizes.addEventListener("change", cost.refresh);
  const load = button("Show", () => go(`#/market?limit=${sizes.value}`));
  const note = el("p", { class: "note", id: "market-note" });
  const area = el("div", { class: "chart-area" });
  const below = el("div", {});
  view.append(
    el("div", { class: "page-head" },
      el("h1", {}, "Market"),
      el("p", { class: "lede" }, "Largest stocks by market cap, coloured by their latest daily return, grouped by sector. Click a stock to open it, a sector to zoom in."),
    ),
    el("div", { class: "controls" }, state.isDemo ? null : sizes, state.isDemo ? null : load, cost.node),
    area,
    note,
    below,
  );
  const signal = viewSignal();
  const fetchIt = async () => {
    area.replaceChildren(el("div", { class: "chart tall", id: "treemap", "aria-label": "Market treemap" }));
    try {
      const doc = await state.client.get("/api/heatmap", { limit }, signal);
      showMetadata(doc._metadata);
      const { rows, meta } = readHeatmap(doc);
      if (!rows.length) {
        area.replaceChildren(el("p", { class: "empty" }, meta.note || "No stock to show."));
        return;
      }
      const div = area.querySelector("#treemap");
      div.dataset.rows = String(rows.length);
      charts.treemap(div, rows, (ticker) => go(`#/stock/${encodeURIComponent(ticker)}`));
      const restricted = meta.restricted_to;
      note.textContent = restricted
        ? `Demo key: the ${rows.length} demo tickers only (${restricted.join(", ")}). A key of your own shows the whole market.`
        : `${rows.length} of ${meta.eligible} stocks priced in the last sessions; returns as of ${doc._metadata.data_as_of}.`;
      below.replaceChildren(staleList(rows, doc._metadata.data_as_of) || "");
    } catch (err) {
      showProblem(area, err, fetchIt);
    }
  };
  fetchIt();
}

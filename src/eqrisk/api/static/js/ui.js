// Pieces every page uses: buttons, the data line, error panels, the cost line, stale marks and
// chart legends.

import { CANCELLED, ApiProblem } from "./api.js";
import * as charts from "./charts.js";
import { el, fmtCredit } from "./format.js";
import { $, askForKey, state, viewSignal } from "./state.js";

export function button(text, onclick, attrs) {
  return el("button", { type: "button", onclick, ...(attrs || {}) }, text);
}

// ----------------------------------------------------------------------------- metadata line

export function showMetadata(meta) {
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

// ----------------------------------------------------------------------------- stale marks

// A stock is stale when its last priced session is older than the snapshot's data_as_of (the
// API's `stale`: sessions_behind >= 1): its values are those of that older session.
// `info` is adapt.js's {stale, lastSession, behind}; the badge says when it was last priced.
export function staleBadge(info, ticker) {
  if (!info || !info.stale) return null;
  const sessions = `${info.behind} session${info.behind === 1 ? "" : "s"}`;
  return el("span", {
    class: "stale-badge",
    title: `Last priced on ${info.lastSession}, ${sessions} before the data date: these values are from that session.`,
    dataset: { staleTicker: ticker || "", lastSession: info.lastSession, behind: String(info.behind) },
  }, `stale: last priced ${info.lastSession}`);
}

// ----------------------------------------------------------------------------- chart legends

// A chart's legend as page content above the plot: it wraps at any width and never covers
// the plot (a plotly legend over a small chart did). `entries`: [{name, color}].
export function chartLegend(entries) {
  return el("ul", { class: "chart-legend" },
    entries.map((e) => el("li", {}, el("i", { class: "swatch", style: `background:${e.color}` }), e.name)));
}

// A chart card: caption, the legend its chart function returns, the plot.
export function chartCard(id, title, caption) {
  const div = el("div", { class: "chart", id });
  const legend = el("div", { class: "legend-slot" });
  const figure = el("figure", { class: "card" },
    el("figcaption", {}, el("b", {}, title), " ", el("span", { class: "muted" }, caption)), legend, div);
  const draw = (fn, ...args) => {
    const entries = fn(div, ...args);
    legend.replaceChildren(entries && entries.length ? chartLegend(entries) : "");
  };
  return { figure, div, draw };
}

export function purgeCharts(container) {
  for (const div of container.querySelectorAll(".chart")) charts.purge(div);
}

// ----------------------------------------------------------------------------- errors

// An error answer shown in place of what it stops: what went wrong, and what to do.
export function problemPanel(err, retry, extraClass) {
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
        "Top up the account, or pick a smaller view; the other views keep working.";
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
        actions.append(button("Use another key", () => askForKey()));
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
    case 429:
      // Reached only after the client waited it out several times: someone else spends this
      // key too (the demo key is shared by every visitor).
      head.textContent = "Too many requests (429)";
      body.textContent =
        `This key allows ${p.limit || "fewer requests"}, and other clients use it as well. ` +
        "Try again, or use a key of your own.";
      if (retry) actions.append(button("Try again", retry, { class: "retry" }));
      break;
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

export function isCancelled(err) {
  return err instanceof ApiProblem && err.code === CANCELLED;
}

// An error in place of a view's part; a request cancelled by leaving the view shows nothing.
export function showProblem(container, err, retry) {
  if (!(err instanceof ApiProblem)) throw err;
  if (isCancelled(err)) return;
  purgeCharts(container);
  container.replaceChildren(problemPanel(err, retry));
}

// ----------------------------------------------------------------------------- cost

// "Cost of this view": the estimate is fetched only when the visitor asks for it (it is free
// but counts toward the rate limit), for the view's calls as the controls stand.
export function costLine(calls) {
  const out = el("span", { class: "cost-text", "aria-live": "polite" });
  let shown = false;
  const refresh = async () => {
    if (!shown) return;
    if (state.isDemo) {
      out.textContent = "Demo key: not charged (counts toward its 5 requests a minute).";
      return;
    }
    const client = state.client;
    const signal = viewSignal();
    out.textContent = "estimating\u2026";
    try {
      const list = calls();
      const answers = await Promise.all(
        list.map((c) => client.post("/api/estimate", { endpoint: c.endpoint, params: c.params }, signal)));
      const total = answers.reduce((s, a) => s + a.estimated_cost_usd, 0);
      const parts = answers.map((a, i) => `${list[i].label} ${fmtCredit(a.estimated_cost_usd)} (${a.estimated_rows} rows)`);
      out.textContent = `${fmtCredit(total)}: ${parts.join(" + ")}`;
      out.dataset.usd = String(total);
    } catch (err) {
      if (isCancelled(err)) return;
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

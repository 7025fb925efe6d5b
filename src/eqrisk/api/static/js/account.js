// The key (dialog, kept in this browser only) and the account strip: balance, this month's
// usage, requests left and the rate limit's wait.

import { Client } from "./api.js";
import { el, fmtCredit } from "./format.js";
import { $, DEMO_KEY, DEMO_TICKERS, EVALUATION_KEY, state } from "./state.js";
import { button, isCancelled, problemPanel } from "./ui.js";
import { onWait, secondsLeft, waitCount } from "./wait.js";

const KEY_STORE = "eqrisk.apiKey";
let onKeyChange = () => {};

function storedKey() {
  try {
    return localStorage.getItem(KEY_STORE);
  } catch (_) {
    return null;
  }
}

function useKey(key, remember) {
  if (state.client) state.client.close();
  state.key = key;
  state.isDemo = key === DEMO_KEY;
  state.isEvaluation = Boolean(EVALUATION_KEY) && key === EVALUATION_KEY;
  state.account = null;
  state.accountError = null;
  state.usage = { requests: 0, usd: 0 };
  state.rate = { limit: null, remaining: null };
  onWait({ until: 0, waiting: 0, problem: null }); // the last key's wait is not this one's
  // A client left behind (another key) may still finish a request: it no longer speaks.
  const client = new Client(key, {
    onMeter: (m) => client === state.client && onMeter(m),
    onWait: (w) => client === state.client && onWait(w),
  });
  state.client = client;
  try {
    if (remember) localStorage.setItem(KEY_STORE, key);
    else localStorage.removeItem(KEY_STORE);
  } catch (_) {
    /* storage disabled: the key lives for this page only */
  }
  renderStrip();
  if (!state.isDemo) loadAccount();
  onKeyChange();
}

function forgetKey() {
  try {
    localStorage.removeItem(KEY_STORE);
  } catch (_) {
    /* nothing stored */
  }
  if (state.client) state.client.close();
  state.key = null;
  state.client = null;
  state.accountError = null;
  onWait({ until: 0, waiting: 0, problem: null });
  renderStrip();
  onKeyChange();
  askForKey();
}

function askForKey(message) {
  const dialog = $("#key-dialog");
  $("#key-message").textContent = message || "";
  $("#key-input").value = state.key && !state.isDemo && !state.isEvaluation ? state.key : "";
  if (!dialog.open) dialog.showModal();
  (EVALUATION_KEY ? $("#use-evaluation") : $("#key-input")).focus();
}

function wireKeyDialog() {
  $("#demo-key-value").textContent = DEMO_KEY;
  const choose = (key) => {
    $("#key-dialog").close();
    useKey(key, $("#key-remember").checked);
  };
  $("#key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const key = $("#key-input").value.trim();
    if (!key) {
      $("#key-message").textContent = "Paste your API key, or use one the page offers.";
      return;
    }
    choose(key);
  });
  $("#use-demo").addEventListener("click", () => choose(DEMO_KEY));
  // The local evaluation key: only on the server `eqrisk demo` started.
  $("#evaluation-offer").hidden = !EVALUATION_KEY;
  $("#use-evaluation").hidden = !EVALUATION_KEY;
  $("#use-key").classList.toggle("primary", !EVALUATION_KEY);
  $("#use-evaluation").addEventListener("click", () => choose(EVALUATION_KEY));
}

// The paid answers that arrive while /api/balance is in flight, each with its cost and the
// balance right after its charge. The balance answer was read at one instant: a charge made
// before it is in its balance and usage, one made after is not. Charges only lower a balance,
// so a paid answer whose balance is below the one read came after the read: its cost is added
// to the month's usage and its balance is the newer one. (A top-up in the same instant can
// hide one such charge until the next load.)
const pendingLoads = new Set();

async function loadAccount() {
  const client = state.client;
  const charges = [];
  pendingLoads.add(charges);
  try {
    const doc = await client.get("/api/balance");
    if (client !== state.client) return;
    const read = doc.balance_usd;
    const usage = { requests: doc.usage_this_month.requests, usd: doc.usage_this_month.usd };
    for (const c of charges) {
      if (c.balanceUsd < read - 1e-9) {
        usage.requests += 1;
        usage.usd += c.costUsd;
        doc.balance_usd = Math.min(doc.balance_usd, c.balanceUsd);
      }
    }
    state.account = doc;
    state.accountError = null;
    state.usage = usage;
    renderStrip();
  } catch (err) {
    if (client !== state.client || isCancelled(err)) return;
    state.accountError = err;
    renderStrip();
  } finally {
    pendingLoads.delete(charges);
  }
}

// A paid answer moves the strip: its cost to the month's usage, and the balance after its
// charge. A free answer's balance header is the balance when the request was let in, which can
// be older than a charge already answered: it does not move the strip.
function onMeter(m) {
  if (m.limit !== null) state.rate = { limit: m.limit, remaining: m.remaining };
  const paid = !state.isDemo && m.status < 300 && m.costUsd !== null && m.costUsd > 0;
  if (paid) {
    state.usage.requests += 1;
    state.usage.usd += m.costUsd;
    if (m.balanceUsd !== null) {
      for (const charges of pendingLoads) charges.push({ costUsd: m.costUsd, balanceUsd: m.balanceUsd });
      if (state.account) state.account.balance_usd = m.balanceUsd;
    }
  }
  renderStrip();
}

function item(label, value, name) {
  return el("span", { class: "strip-item", dataset: name ? { item: name } : undefined }, el("b", {}, label), " ", value);
}

function renderStrip() {
  const error = state.accountError;
  const strip = $("#account");
  strip.replaceChildren();
  if (!state.key) {
    strip.append(el("span", { class: "muted" }, "No API key yet."), button("Enter a key", () => askForKey()));
    return;
  }
  const items = [];
  if (state.isDemo) {
    items.push(item("Key", "demo key"), item("Covers", DEMO_TICKERS.join(" ")), item("Cost", "not charged"));
  } else if (state.account) {
    const a = state.account;
    items.push(
      item("Key", state.isEvaluation ? `${a.key_id} (local evaluation key)` : a.key_id),
      item("Account", `${a.account_id} (${a.state})`),
      item("Balance", fmtCredit(a.balance_usd), "balance"),
      item("This month", `${state.usage.requests} paid request${state.usage.requests === 1 ? "" : "s"}, ${fmtCredit(state.usage.usd)}`, "usage"),
    );
  } else if (error) {
    items.push(item("Key", "not accepted"));
  } else {
    items.push(item("Key", "checking\u2026"));
  }
  const r = state.rate;
  if (r.limit !== null) {
    const text = [`${r.remaining} of ${r.limit} left`];
    if (secondsLeft() > 0) text.push(", next in ", waitCount());
    items.push(item("Requests", el("span", {}, ...text), "rate"));
  }
  strip.append(...items);
  strip.append(
    el("span", { class: "strip-actions" }, button("Change key", () => askForKey()), button("Forget key", forgetKey)),
  );
  if (error) strip.append(problemPanel(error, loadAccount, "strip-error"));
}

// The key dialog and the strip; `keyChanged` runs when the page moves to another key (or none).
export function wireAccount(keyChanged) {
  onKeyChange = keyChanged;
  wireKeyDialog();
  document.addEventListener("eqrisk:ask-key", (event) => askForKey(event.detail.message));
  document.addEventListener("eqrisk:wait", renderStrip);
  const key = storedKey();
  if (key) {
    useKey(key, true);
    return;
  }
  renderStrip();
  onKeyChange();
  askForKey();
}

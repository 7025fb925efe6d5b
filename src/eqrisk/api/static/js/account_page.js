// The account page: with one of the account's keys, its balance, its usage by day and route (a
// chart), its ledger as CSV, its keys (create, name, revoke, rotate) and a top-up through
// Stripe (a PaymentIntent; the credit follows Stripe's signed event, so the page polls the
// balance). The key is kept in this browser only, as on the dashboard.

import { loadStripe, options, postJson, say } from "./stripe_js.js";

const $ = (id) => document.getElementById(id);
const KEY_STORE = "eqrisk.apiKey";
const TOKEN_USD = 0.00002;
let key = null;

async function get(path) {
  const resp = await fetch(path, { headers: { Authorization: `Bearer ${key}` } });
  if (!resp.ok) {
    const doc = await resp.json().catch(() => ({}));
    throw new Error(doc.detail || `HTTP ${resp.status}`);
  }
  return resp;
}

function problem(err) {
  const box = $("problem");
  box.textContent = err.message;
  box.hidden = false;
}

async function showBalance() {
  const doc = await (await get("/api/balance")).json();
  say($("balance"), `Account ${doc.account_id} (${doc.state}): balance ${doc.balance_usd.toFixed(5)} USD`);
  return doc.balance_tokens;
}

async function showUsage() {
  const doc = await (await get("/api/account/usage?days=30")).json();
  const routes = [...new Set(doc.by_day.map((r) => r.route))];
  const traces = routes.map((route) => {
    const rows = doc.by_day.filter((r) => r.route === route);
    return { type: "bar", name: route, x: rows.map((r) => r.day), y: rows.map((r) => r.usd) };
  });
  window.Plotly.react($("usage-chart"), traces, {
    barmode: "stack",
    margin: { t: 10, r: 10, b: 40, l: 60 },
    yaxis: { title: { text: "USD" } },
    xaxis: { type: "category" },
  }, { displayModeBar: false, responsive: true });
}

function keyRow(k) {
  const tr = document.createElement("tr");
  const expired = k.expires_at && new Date(k.expires_at) <= new Date();
  const stateText = k.revoked_at ? "revoked" : expired ? "expired" : "active";
  const expires = k.expires_at ? k.expires_at.slice(0, 10) : "";
  for (const text of [k.key_id, k.label || "", k.created_at.slice(0, 10), expires, stateText]) {
    const td = document.createElement("td");
    td.textContent = text;
    tr.append(td);
  }
  const actions = document.createElement("td");
  if (!k.revoked_at) {
    for (const action of ["rotate", "revoke"]) {
      const b = document.createElement("button");
      b.type = "button";
      b.textContent = action;
      b.dataset.action = action;
      b.dataset.keyId = k.key_id;
      b.addEventListener("click", () => keyAction(action, k.key_id));
      actions.append(b);
    }
  }
  tr.append(actions);
  return tr;
}

async function showKeys() {
  const doc = await (await get("/api/account/keys")).json();
  $("keys").tBodies[0].replaceChildren(...doc.keys.map(keyRow));
}

async function keyAction(action, keyId, label, expiresAt) {
  const body = { action, key_id: keyId, label, expires_at: expiresAt || null };
  const { status, doc } = await postJson("/api/account/keys", body, key);
  if (status !== 200) {
    say($("key-shown"), doc.detail || `HTTP ${status}`, "problem");
    return;
  }
  say($("key-shown"), doc.key ? `New key (shown once, keep it): ${doc.key}` : `Key ${doc.key_id} revoked.`, "note key-once");
  if (doc.revoked_key_id && doc.revoked_key_id === current()) {
    useKey(doc.key);
  }
  await showKeys();
}

function current() {
  return key ? key.split("_")[1] : null;
}

async function downloadLedger() {
  const blob = await (await get("/api/account/ledger")).blob();
  const link = document.createElement("a");
  link.href = URL.createObjectURL(blob);
  link.download = "ledger.csv";
  link.click();
  URL.revokeObjectURL(link.href);
}

async function topUp(opts, amount) {
  const { status, doc } = await postJson("/api/account/topup", { amount_usd: amount }, key);
  if (status !== 201) {
    say($("topup-status"), doc.detail || `HTTP ${status}`, "problem");
    return;
  }
  const stripe = await loadStripe(opts);
  const box = $("topup-card");
  box.hidden = false;
  box.replaceChildren();
  const card = stripe.elements().create("card");
  card.mount("#topup-card");
  const pay = $("topup-pay");
  pay.hidden = false;
  pay.dataset.paymentIntent = doc.payment_intent;
  say($("topup-status"), `Top-up of ${amount} USD: enter a card and pay.`);
  const before = await showBalance();
  pay.onclick = async () => {
    pay.disabled = true;
    const result = await stripe.confirmCardPayment(doc.client_secret, { payment_method: { card } });
    if (result.error) {
      say($("topup-status"), result.error.message || "the payment was refused", "problem");
      pay.disabled = false;
      return;
    }
    await awaitCredit(before, amount);
  };
  awaitCredit(before, amount);
}

async function awaitCredit(before, amount) {
  const want = before + Math.round(amount / TOKEN_USD);
  for (let i = 0; i < 120; i += 1) {
    if ((await showBalance()) >= want) {
      say($("topup-status"), `Credited: ${amount} USD.`);
      $("topup-pay").hidden = true;
      $("topup-card").hidden = true;
      return;
    }
    await new Promise((r) => setTimeout(r, 1000));
  }
}

async function open() {
  $("problem").hidden = true;
  try {
    await showBalance();
    $("account-view").hidden = false;
    await Promise.all([showUsage(), showKeys()]);
  } catch (err) {
    $("account-view").hidden = true;
    problem(err);
  }
}

function useKey(value) {
  key = value.trim();
  $("key-input").value = key;
  try {
    localStorage.setItem(KEY_STORE, key);
  } catch (_) {
    // private mode: kept for this page only
  }
}

async function start() {
  const opts = await options();
  const stored = (() => {
    try {
      return localStorage.getItem(KEY_STORE);
    } catch (_) {
      return null;
    }
  })();
  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    useKey($("key-input").value);
    open();
  });
  $("new-key").addEventListener("submit", (event) => {
    event.preventDefault();
    const day = $("new-key-expiry").value; // YYYY-MM-DD: the key works until that day starts (UTC)
    keyAction("create", null, $("new-key-label").value || null, day ? `${day}T00:00:00Z` : null);
  });
  $("ledger-csv").addEventListener("click", () => downloadLedger().catch(problem));
  const topup = $("topup");
  if (opts.self_service) {
    for (const amount of opts.topup_amounts_usd) {
      const b = document.createElement("button");
      b.type = "button";
      b.textContent = `${amount} USD`;
      b.dataset.amount = String(amount);
      b.addEventListener("click", () => topUp(opts, amount));
      topup.append(b);
    }
  } else {
    topup.textContent = opts.message;
  }
  if (stored && stored.startsWith("eqk_")) {
    useKey(stored);
    open();
  }
}

start().catch(problem);

// The sign-up page: name and email, the card confirmed on Stripe's side (a SetupIntent), then
// the first key, shown once, when Stripe's signed event has verified the card (the page polls
// the one-time claim; the claim token stays in this page's memory only).

import { loadStripe, options, postJson, say } from "./stripe_js.js";

const $ = (id) => document.getElementById(id);
const POLL_MS = 1000;
const POLL_TRIES = 120;

async function claimKey(token) {
  for (let i = 0; i < POLL_TRIES; i += 1) {
    const { status, doc } = await postJson("/api/signup/claim", { claim_token: token });
    if (status === 200) return doc;
    if (status !== 202) throw new Error(doc.detail || `HTTP ${status}`);
    await new Promise((r) => setTimeout(r, POLL_MS));
  }
  throw new Error("the card check did not finish; reload this page later");
}

function showKey(doc) {
  const out = $("result");
  out.replaceChildren();
  const head = document.createElement("p");
  head.textContent = `Account ${doc.account_id} is verified. Your API key (shown once, keep it):`;
  const key = document.createElement("p");
  key.id = "new-key";
  key.className = "key-once";
  key.textContent = doc.key;
  const credit = document.createElement("p");
  credit.textContent = doc.note
    ? `No starting credit: ${doc.note}.`
    : `Starting credit: ${(doc.balance_tokens * 0.00002).toFixed(2)} USD.`;
  const next = document.createElement("p");
  const link = document.createElement("a");
  link.href = "/account";
  link.textContent = "Open your account page";
  next.append(link);
  out.append(head, key, credit, next);
}

async function start() {
  const opts = await options();
  if (!opts.self_service) {
    say($("offer"), opts.message);
    return;
  }
  say($("offer"), `Sign up, verify a card (no charge) and get a key with ${opts.starting_credit_usd} USD of credit, once per card.`);
  const form = $("signup-form");
  form.hidden = false;
  const stripe = await loadStripe(opts);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    $("signup-submit").disabled = true;
    const { status, doc } = await postJson("/api/signup", {
      name: $("signup-name").value,
      email: $("signup-email").value,
    });
    if (status !== 201) {
      say($("result"), doc.detail || `HTTP ${status}`, "problem");
      $("signup-submit").disabled = false;
      return;
    }
    form.hidden = true;
    $("card-step").hidden = false;
    const card = stripe.elements().create("card");
    card.mount("#card-element");
    $("card-submit").addEventListener("click", async () => {
      $("card-submit").disabled = true;
      say($("result"), "Checking the card…");
      const result = await stripe.confirmCardSetup(doc.setup_client_secret, {
        payment_method: { card },
      });
      if (result.error) {
        say($("result"), result.error.message || "the card was refused", "problem");
        $("card-submit").disabled = false;
        return;
      }
      say($("result"), "Card accepted; waiting for Stripe's confirmation…");
      try {
        showKey(await claimKey(doc.claim_token));
        $("card-step").hidden = true;
      } catch (err) {
        say($("result"), err.message, "problem");
      }
    });
  });
}

start().catch((err) => say($("result"), err.message, "problem"));

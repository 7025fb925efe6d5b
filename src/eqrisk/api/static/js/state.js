// What the page's modules share: the state of this visit and the keys the server offers.

const meta = (name) => {
  const tag = document.querySelector(`meta[name="${name}"]`);
  return tag ? tag.content : "";
};

export const DEMO_KEY = meta("eqrisk-demo-key");
// The local evaluation key: offered only by the server `eqrisk demo` starts (else empty).
export const EVALUATION_KEY = meta("eqrisk-evaluation-key");
export const DEMO_TICKERS = ["AAPL", "MSFT", "GOOGL", "AMZN", "NVDA", "META", "TSLA"];

export const state = {
  key: null,
  client: null,
  isDemo: false,
  isEvaluation: false,
  account: null, // the /api/balance answer (real keys)
  accountError: null, // why /api/balance failed: kept, so a later meter update cannot erase it
  usage: { requests: 0, usd: 0 },
  rate: { limit: null, remaining: null },
  wait: { until: 0, waiting: 0, problem: null }, // the rate limit's one wait (api.js)
  metadata: null,
  page: null,
  view: null, // the AbortController of the view on screen: leaving it cancels its waits
};

export const $ = (selector) => document.querySelector(selector);

// Asks for a key (the dialog lives in account.js; other modules ask through this event).
export function askForKey(message) {
  document.dispatchEvent(new CustomEvent("eqrisk:ask-key", { detail: { message } }));
}

// The signal of the view on screen, for its requests.
export function viewSignal() {
  return state.view ? state.view.signal : undefined;
}

export function go(hash) {
  if (location.hash === hash) window.dispatchEvent(new HashChangeEvent("hashchange"));
  else location.hash = hash;
}

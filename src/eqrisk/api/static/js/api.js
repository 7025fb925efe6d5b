// The page's client of the public API: the same routes and keys as any client.
// Frugal by design (the demo key allows 5 requests a minute, free calls included): answers are
// cached in memory per key and model version, identical requests in flight are shared, and
// nothing is fetched that the page does not show.
//
// The rate limit is waited out here, once for every view: the client keeps one deadline (the
// next free request of the key: a 429's Retry-After, or X-RateLimit-Reset once an answer says
// none is left), holds every request until it passes and sends a refused (429) request again
// after it. `onWait` tells the page when requests start or stop waiting, so that it shows the
// one countdown; a view that is left cancels its waiting requests (its AbortSignal).

export class ApiProblem extends Error {
  // An error answer (problem+json) or a network failure, with what the page needs to say it.
  constructor(status, problem, retryAfter) {
    super((problem && problem.detail) || `HTTP ${status}`);
    this.status = status;
    this.code = (problem && problem.error) || (status === 0 ? "NETWORK_ERROR" : `HTTP_${status}`);
    this.problem = problem || {};
    this.retryAfter = retryAfter; // seconds, for a 429
  }
}

// A request given up because its view was left (or the key changed) while it waited: not an
// error to show.
export const CANCELLED = "CANCELLED";

// Codes whose answer does not change until the key or the snapshot does: cached like data.
const STABLE_ERRORS = new Set(["DEMO_RESTRICTED", "TICKER_NOT_FOUND"]);
// How often one request waits out a 429 before the view is told (someone else spends the key).
const MAX_WAITS = 3;

function cancelled() {
  return new ApiProblem(-1, { error: CANCELLED, detail: "cancelled" });
}

// Resolves after `ms`, or rejects (cancelled) when `signal` aborts first.
function sleep(ms, signal) {
  return new Promise((resolve, reject) => {
    if (signal && signal.aborted) {
      reject(cancelled());
      return;
    }
    const timer = setTimeout(() => {
      if (signal) signal.removeEventListener("abort", stop);
      resolve();
    }, ms);
    const stop = () => {
      clearTimeout(timer);
      reject(cancelled());
    };
    if (signal) signal.addEventListener("abort", stop, { once: true });
  });
}

export class Client {
  // hooks: {onMeter(m), onWait(wait)}: what each answer says about cost and limits, and the
  // rate-limit wait ({until: ms, waiting: requests held, problem: the 429's body or null}).
  constructor(key, hooks) {
    this.key = key;
    this.hooks = hooks;
    this.cache = new Map();
    this.modelVersion = null;
    this.waitUntil = 0; // ms since the epoch: no request leaves before
    this.waitProblem = null; // the 429 that set the deadline (null: the answers said so)
    this.waiting = 0; // requests held until the deadline
    this.closed = false; // the page moved to another key: nothing more is sent
  }

  close() {
    this.closed = true;
  }

  headers(extra) {
    return { Authorization: `Bearer ${this.key}`, ...extra };
  }

  get(path, params, signal) {
    return this.request("GET", path + query(params), undefined, signal);
  }

  post(path, body, signal) {
    return this.request("POST", path, body, signal);
  }

  // A binary download (CSV or Parquet): {blob, filename}; not cached (the browser keeps the file).
  async download(path, params, signal) {
    const resp = await this.fetch("GET", path + query(params), undefined, signal);
    const disposition = resp.headers.get("Content-Disposition") || "";
    const match = /filename="?([^";]+)"?/.exec(disposition);
    return { blob: await resp.blob(), filename: match ? match[1] : "eqrisk-data" };
  }

  request(method, url, body, signal) {
    const cacheKey = `${method} ${url} ${body === undefined ? "" : JSON.stringify(body)}`;
    const hit = this.cache.get(cacheKey);
    if (hit) return hit;
    const pending = this.fetch(method, url, body, signal).then((resp) => resp.json());
    this.cache.set(cacheKey, pending);
    pending.catch((err) => {
      const keep = err instanceof ApiProblem && STABLE_ERRORS.has(err.code);
      if (!keep && this.cache.get(cacheKey) === pending) this.cache.delete(cacheKey);
    });
    return pending;
  }

  // The rate limit's wait, told to the page as it starts and ends.
  async waitTurn(signal) {
    while (Date.now() < this.waitUntil) {
      this.waiting += 1;
      this.tellWait();
      try {
        await sleep(this.waitUntil - Date.now(), signal);
      } finally {
        this.waiting -= 1;
        this.tellWait();
      }
    }
    if (this.closed || (signal && signal.aborted)) throw cancelled();
  }

  tellWait() {
    this.hooks.onWait({ until: this.waitUntil, waiting: this.waiting, problem: this.waitProblem });
  }

  async fetch(method, url, body, signal) {
    for (let waits = 0; ; waits += 1) {
      await this.waitTurn(signal);
      const resp = await this.send(method, url, body);
      if (resp.ok) return resp;
      let problem = null;
      try {
        problem = await resp.json();
      } catch (_) {
        problem = { detail: `${resp.status} ${resp.statusText}` };
      }
      const header = Number(resp.headers.get("Retry-After"));
      const wait = resp.headers.get("Retry-After") !== null && Number.isFinite(header) ? header : null;
      if (resp.status === 429 && wait !== null && waits < MAX_WAITS) {
        this.waitUntil = Math.max(this.waitUntil, Date.now() + wait * 1000);
        this.waitProblem = problem;
        continue; // waited out at the top of the loop, then sent again
      }
      throw new ApiProblem(resp.status, problem, wait);
    }
  }

  async send(method, url, body) {
    const init = { method, headers: this.headers({ Accept: "application/json" }) };
    if (body !== undefined) {
      init.body = JSON.stringify(body);
      init.headers["Content-Type"] = "application/json";
    }
    let resp;
    try {
      resp = await fetch(url, init);
    } catch (err) {
      throw new ApiProblem(0, { detail: `the server could not be reached (${err.message})` });
    }
    this.meter(resp);
    return resp;
  }

  meter(resp) {
    const h = (name) => resp.headers.get(name);
    const num = (name) => (h(name) === null ? null : Number(h(name)));
    const version = h("X-Model-Version");
    if (version && this.modelVersion && version !== this.modelVersion) {
      this.cache.clear(); // a new snapshot: every cached answer is out of date
    }
    if (version) this.modelVersion = version;
    const remaining = num("X-RateLimit-Remaining");
    const reset = num("X-RateLimit-Reset");
    if (resp.status !== 429 && remaining !== null) {
      // None left: the next request waits for the window's next free slot; some left: none
      // waits. The reset is the server's clock: counted from the answer's Date, not this one's.
      const serverNow = Date.parse(h("Date") || "") || Date.now();
      const free = reset ? Date.now() + Math.max(0, reset * 1000 - serverNow) : 0;
      this.waitUntil = remaining === 0 ? Math.max(this.waitUntil, free) : 0;
      this.waitProblem = null;
      this.tellWait();
    }
    this.hooks.onMeter({
      status: resp.status,
      costUsd: num("X-API-Cost-USD"),
      balanceUsd: num("X-Balance-Remaining-USD"),
      limit: h("X-RateLimit-Limit"),
      remaining,
    });
  }
}

export function query(params) {
  if (!params) return "";
  const pairs = Object.entries(params).filter(([, v]) => v !== undefined && v !== null);
  if (!pairs.length) return "";
  return "?" + pairs.map(([k, v]) => `${encodeURIComponent(k)}=${encodeURIComponent(v)}`).join("&");
}

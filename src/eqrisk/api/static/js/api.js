// The page's client of the public API: the same routes and keys as any client.
// Frugal by design (the demo key allows 5 requests a minute, free calls included): answers are
// cached in memory per key and model version, identical requests in flight are shared, and
// nothing is fetched that the page does not show.

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

// Codes whose answer does not change until the key or the snapshot does: cached like data.
const STABLE_ERRORS = new Set(["DEMO_RESTRICTED", "TICKER_NOT_FOUND"]);

export class Client {
  constructor(key, onMeter) {
    this.key = key;
    this.onMeter = onMeter; // called with what each answer's headers say about cost and limits
    this.cache = new Map();
    this.modelVersion = null;
  }

  headers(extra) {
    return { Authorization: `Bearer ${this.key}`, ...extra };
  }

  get(path, params) {
    return this.request("GET", path + query(params));
  }

  post(path, body) {
    return this.request("POST", path, body);
  }

  // A binary download (CSV or Parquet): {blob, filename}; not cached (the browser keeps the file).
  async download(path, params) {
    const resp = await this.fetch("GET", path + query(params));
    const disposition = resp.headers.get("Content-Disposition") || "";
    const match = /filename="?([^";]+)"?/.exec(disposition);
    return { blob: await resp.blob(), filename: match ? match[1] : "eqrisk-data" };
  }

  request(method, url, body) {
    const cacheKey = `${method} ${url} ${body === undefined ? "" : JSON.stringify(body)}`;
    const hit = this.cache.get(cacheKey);
    if (hit) return hit;
    const pending = this.fetch(method, url, body).then((resp) => resp.json());
    this.cache.set(cacheKey, pending);
    pending.catch((err) => {
      if (!(err instanceof ApiProblem && STABLE_ERRORS.has(err.code))) this.cache.delete(cacheKey);
    });
    return pending;
  }

  async fetch(method, url, body) {
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
    if (!resp.ok) {
      let problem = null;
      try {
        problem = await resp.json();
      } catch (_) {
        problem = { detail: `${resp.status} ${resp.statusText}` };
      }
      const wait = Number(resp.headers.get("Retry-After"));
      throw new ApiProblem(resp.status, problem, Number.isFinite(wait) ? wait : null);
    }
    return resp;
  }

  meter(resp) {
    const h = (name) => resp.headers.get(name);
    const version = h("X-Model-Version");
    if (version && this.modelVersion && version !== this.modelVersion) {
      this.cache.clear(); // a new snapshot: every cached answer is out of date
    }
    if (version) this.modelVersion = version;
    this.onMeter({
      status: resp.status,
      costUsd: h("X-API-Cost-USD") === null ? null : Number(h("X-API-Cost-USD")),
      balanceUsd: h("X-Balance-Remaining-USD") === null ? null : Number(h("X-Balance-Remaining-USD")),
      limit: h("X-RateLimit-Limit"),
      remaining: h("X-RateLimit-Remaining") === null ? null : Number(h("X-RateLimit-Remaining")),
      reset: h("X-RateLimit-Reset") === null ? null : Number(h("X-RateLimit-Reset")),
    });
  }
}

export function query(params) {
  if (!params) return "";
  const pairs = Object.entries(params).filter(([, v]) => v !== undefined && v !== null);
  if (!pairs.length) return "";
  return "?" + pairs.map(([k, v]) => `${encodeURIComponent(k)}=${encodeURIComponent(v)}`).join("&");
}

// Readers of the answers whose shape is expected to change. The page reads them only here, so a
// change of the wire format is an edit of one function.

// A metrics snapshot (`/api/metrics/{ticker}`):
// -> {ticker, teo, metrics: {vol_23d, l3_mkt_hr, ...}, meta: {company_name, sector_etf, ...},
//     staleness: {stale, lastSession, behind}}.
export function readMetrics(doc) {
  return {
    ticker: doc.ticker,
    teo: doc.teo,
    metrics: doc.metrics || {},
    meta: doc.meta || {},
    staleness: readStaleness(doc),
  };
}

// A batch entry in the real Service B's shape (issue 13): `full_metrics` is flat (the values
// plus ticker and date = teo), the symbol's names and ETFs are in the entry's `meta`.
function readEntrySnapshot(ticker, entry) {
  const flat = entry.full_metrics || {};
  return {
    ticker: flat.ticker || ticker,
    teo: flat.date || flat.teo,
    metrics: flat,
    meta: entry.meta || {},
    staleness: readStaleness(flat),
  };
}

// The batch answer (`POST /api/batch/analyze` with metrics ["full_metrics"]) -> one entry per
// ticker in answer order: {ticker, ok, error: {code, detail} | null, snapshot | null}.
// A succeeded entry has `status: "success"`; a failed one a string `error` and its `code`.
export function readBatch(doc) {
  return Object.entries(doc.results || {}).map(([ticker, entry]) => {
    const ok = entry.status === "success";
    return {
      ticker,
      ok,
      error: ok ? null : { code: entry.code, detail: entry.detail || entry.error },
      snapshot: ok ? readEntrySnapshot(ticker, entry) : null,
    };
  });
}

// How far a stock's last price lies behind the snapshot's data_as_of, from any answer that says
// it (metrics: stale, last_session, sessions_behind; heatmap rows and batch full_metrics: stale,
// teo or date, sessions_behind) -> {stale, lastSession, behind}.
export function readStaleness(doc) {
  return {
    stale: Boolean(doc.stale),
    lastSession: doc.last_session || doc.teo || doc.date || null,
    behind: Number(doc.sessions_behind) || 0,
  };
}

// A heatmap answer (`/api/heatmap`) -> {rows (each with `staleness`), meta}.
export function readHeatmap(doc) {
  return {
    rows: (doc.data || []).map((r) => ({ ...r, staleness: readStaleness(r) })),
    meta: doc.meta || {},
  };
}

#!/usr/bin/env bash
# The daily job (docs/DEPLOYMENT.md): merge the vendor's file of the day, build incrementally,
# then wait until every server answers the new version. Settings from the environment
# (/etc/eqrisk.env); EQRISK_INCOMING: the vendor's folder; EQRISK_SERVERS: "host:port ...".
set -euo pipefail
incoming="${EQRISK_INCOMING:-/data/incoming}"
logs="${EQRISK_JOB_LOGS:-/var/log/eqrisk}"
day="$(date +%F)"
# ingest --merge, then build: incremental unless the history changed; exit 1 without building
# when rows were rejected, 3 for an environment problem (see docs/DEPLOYMENT.md)
eqrisk update "$incoming/$day.csv" --json > "$logs/build-$day.json"
want=$(eqrisk snapshots --json | jq -r .current)
for server in ${EQRISK_SERVERS:-}; do
  got=""
  for _ in $(seq 30); do
    got=$(curl -fsS "http://$server/api/health" | jq -r .model_version) || true
    [ "$got" = "$want" ] && break
    sleep 2
  done
  [ "$got" = "$want" ] || { echo "$server still serves $got, not $want" >&2; exit 1; }
done

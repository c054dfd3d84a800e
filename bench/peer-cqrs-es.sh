#!/usr/bin/env bash
# Peer benchmark: cqrs-es 0.5 + postgres-es 0.5 driving N operations x (Receive, Claim, Confirm),
# then replay-all, load-all and a raw scan (see ../shared/bench/README.md).
#
# Copies the peer's source into target/peer-cqrs-es/src (never into the repo; target/ is
# git-ignored), builds it in release mode (build dir target/peer-cqrs-es/target is kept, so
# rebuilds are fast), then for each concurrency runs it against a fresh scratch database that is
# dropped afterwards, and prints each JSON line plus a Markdown summary table.
#
#   bench/peer-cqrs-es.sh                               # OPS=10000, CONCURRENCY="1 8 32"
#   OPS=2000 CONCURRENCY="8" bench/peer-cqrs-es.sh
#
# Env: PEER_SRC (peer source dir), OPS, CONCURRENCY, PGURL_BASE (server URL without a database;
# psql must reach it, e.g. PostgreSQL trust auth on 127.0.0.1:5432).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
PEER_SRC=${PEER_SRC:-$here/../../shared/bench/peers/cqrs-es-postgres}
OPS=${OPS:-10000}
CONCURRENCY=${CONCURRENCY:-"1 8 32"}
PGURL_BASE=${PGURL_BASE:-postgres://postgres@127.0.0.1:5432}
work=$here/../target/peer-cqrs-es
export CARGO_TARGET_DIR=$work/target

mkdir -p "$work/src"
rsync -a --delete --chmod=u+w --exclude /target "$PEER_SRC/" "$work/src/"
t0=$SECONDS
cargo build --release --manifest-path "$work/src/Cargo.toml"
echo "# build: $((SECONDS - t0)) s" >&2

db=""
drop_db() { [[ -n $db ]] && psql -q "$PGURL_BASE/postgres" -c "DROP DATABASE IF EXISTS $db" || true; db=""; }
trap drop_db EXIT
trap 'exit 130' INT TERM   # exit runs the EXIT trap, which drops the scratch DB

rows=()
for c in $CONCURRENCY; do
  db=peer_cqrs_$$_$c
  psql -q "$PGURL_BASE/postgres" -c "CREATE DATABASE $db"
  t0=$SECONDS
  line=$("$CARGO_TARGET_DIR/release/cqrs-es-postgres-peer" --ops "$OPS" --concurrency "$c" \
           --db-url "$PGURL_BASE/$db")
  echo "concurrency=$c wall=$((SECONDS - t0))s $line"
  drop_db
  rows+=("$(jq -r '"| \(.concurrency) | \(.ops) | \(.ops_per_s) | \(.appends_per_s) | \(.command_p50_us) | \(.command_p99_us) | \(.replay_all_events_per_s) | \(.load_all_events_per_s) | \(.raw_scan_rows_per_s) |"' <<<"$line")")
done

echo
echo "| concurrency | ops | lifecycle ops/s | appends/s | cmd p50 µs | cmd p99 µs | replay-all ev/s | load-all ev/s | raw scan rows/s |"
echo "|---|---|---|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"

#!/usr/bin/env bash
# schemathesis against the read API: starts a real `opledger serve` on a fresh SQLite ledger
# with an admin token and some data, then runs schemathesis on `/v1/openapi.json` with the
# checks that matter, bounded in examples and time. Exits non-zero on any failure.
#
# Usage: tests/schemathesis/run.sh [path/to/opledger]
# SCHEMATHESIS names the `st` executable (default: `st` on PATH); .ci/run installs a pinned
# version into a virtualenv. ST_MAX_EXAMPLES and ST_MAX_TIME bound the run (defaults 100 cases
# per operation and phase, 180 s).
set -euo pipefail
cd "$(dirname "$0")/../.."

bin="${1:-target/debug/opledger}"
st="${SCHEMATHESIS:-st}"
max_examples="${ST_MAX_EXAMPLES:-100}"
max_time="${ST_MAX_TIME:-180}"

if [ ! -x "$bin" ]; then
  cargo build -p opledger-cli --locked
fi

work="$(mktemp -d)"
serve_pid=""
cleanup() {
  if [ -n "$serve_pid" ] && kill -0 "$serve_pid" 2>/dev/null; then
    kill -TERM "$serve_pid" 2>/dev/null || true
    wait "$serve_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

export SHOP_BOT_TOKEN="123456:schemathesis-token_abcdefghij"
export SHOP_WEBHOOK_SECRET="schemathesis-webhook-secret"
export OPLEDGER_ADMIN_TOKEN="schemathesis-admin-token-0123456789abcdef"
cat >"$work/opledger.toml" <<TOML
[server]
listen = "127.0.0.1:0"

[api]
admin_token_env = "OPLEDGER_ADMIN_TOKEN"

[[bots]]
name = "shop"
token_env = "SHOP_BOT_TOKEN"
webhook_secret_env = "SHOP_WEBHOOK_SECRET"
# Nothing listens there: replies fail and are recorded, as the data should show.
api_base_url = "http://127.0.0.1:9"

[[actions]]
name = "coupon"
bot = "shop"
command = "coupon"
params = ["campaign"]
key = "{campaign}:{user_id}"

[actions.effector]
# Nothing listens there either: calls are retried, then fail.
url = "http://127.0.0.1:9/coupons"
max_attempts = 2
TOML

"$bin" --config "$work/opledger.toml" --database-url "sqlite://$work/ledger.db" serve \
  >"$work/stdout" 2>"$work/stderr" &
serve_pid=$!
address=""
for _ in $(seq 1 300); do
  address="$(sed -n 's|^opledger is serving on http://\([^ ]*\) .*|\1|p' "$work/stdout")"
  [ -n "$address" ] && break
  kill -0 "$serve_pid" 2>/dev/null || { cat "$work/stderr" >&2; echo "opledger serve ended" >&2; exit 1; }
  sleep 0.1
done
[ -n "$address" ] || { echo "opledger serve did not start" >&2; exit 1; }
echo "opledger serve on $address"

# Some data: commands from a few users (operations that retry and fail), /help, a duplicate,
# a button-less callback and a body that is not an update (quarantined).
deliver() {
  curl -sS -o /dev/null -w '%{http_code}' -X POST "http://$address/telegram/shop/webhook" \
    -H "content-type: application/json" \
    -H "x-telegram-bot-api-secret-token: $SHOP_WEBHOOK_SECRET" --data-binary "$1"
}
message() {
  printf '{"update_id":%d,"message":{"message_id":%d,"date":%d,"chat":{"id":%d,"type":"private"},"from":{"id":%d,"is_bot":false,"first_name":"T"},"text":"%s","entities":[{"type":"bot_command","offset":0,"length":%d}]}}' \
    "$1" "$1" "$(( 1790000000 + $1 ))" "$2" "$2" "$3" "$4"
}
update=0
for user in 41 42 43; do
  for text in "/coupon spring:7" "/coupon summer:6" "/help:5" "/status:7"; do
    update=$(( update + 1 ))
    status="$(deliver "$(message "$update" "$user" "${text%:*}" "${text##*:}")")"
    [ "$status" = 200 ] || { echo "delivery $update answered $status" >&2; exit 1; }
  done
done
deliver "$(message 1 41 "/coupon spring" 7)" >/dev/null
deliver 'not an update' >/dev/null
# Let the worker try the calls and the read models catch up.
sleep 4

# One worker: with two threads, Hypothesis parses lambda sources concurrently and CPython 3.11's
# `ast` can fail with "AST constructor recursion depth mismatch" (a runtime error of the tool,
# seen in CI at 19,033 cases with 0 failures), which would fail the run for nothing.
echo "schemathesis: $("$st" --version)"
started=$(date +%s)
set +e
"$st" run "http://$address/v1/openapi.json" \
  --header "Authorization: Bearer $OPLEDGER_ADMIN_TOKEN" \
  --checks not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance \
  --max-examples "$max_examples" \
  --max-time "$max_time" \
  --seed 20261101 \
  --generation-database none \
  --workers 1 \
  --no-color \
  --report junit --report-dir "$work/report" 2>&1 | tee "$work/schemathesis.log"
status=${PIPESTATUS[0]}
set -e
# Its "Test cases:" summary, e.g. "5946 generated, 5946 passed, 15 errored", as one closing line.
summary="$(sed -n '/^Test cases:/{n;p}' "$work/schemathesis.log" | head -n 1)"
generated="$(grep -Eo '[0-9]+ generated' <<<"$summary" | grep -Eo '[0-9]+' || echo 0)"
passed="$(grep -Eo '[0-9]+ passed' <<<"$summary" | grep -Eo '[0-9]+' || echo 0)"
errored="$(grep -Eo '[0-9]+ errored' <<<"$summary" | grep -Eo '[0-9]+' || echo 0)"
echo "schemathesis took $(( $(date +%s) - started )) s and exited with $status; test cases: $summary"
echo "schemathesis: $passed passed, $(( generated - passed + errored )) failed"
if ! kill -0 "$serve_pid" 2>/dev/null; then
  echo "opledger serve died during the run:" >&2
  cat "$work/stderr" >&2
  exit 1
fi
if grep -q "panicked" "$work/stderr"; then
  echo "opledger serve panicked during the run:" >&2
  grep -m 5 -A 2 "panicked" "$work/stderr" >&2 || true
  exit 1
fi
exit "$status"

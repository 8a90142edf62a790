#!/usr/bin/env bash
# Schemathesis (property-based API testing, from PyPI) against a real `switchyard serve` and
# its own `/openapi.json`, once per role (admin, infra, finance, developer): no 5xx, and every
# response documented (status code, content type, body schema).
#
#   scripts/schemathesis.sh                 the debug binary (target/debug/switchyard)
#   SWITCHYARD_BIN=target/release/switchyard SWITCHYARD_SCHEMATHESIS_EXAMPLES=200 scripts/schemathesis.sh
#
# Installs schemathesis into a virtual environment under target/ when missing. The broker runs
# on 127.0.0.1 and a free port with a fresh data directory (SQLite), with the one on-prem pool
# of the end-to-end tests; it is stopped and removed at exit. Reports (JUnit, and the broker's
# log) go to target/schemathesis/.
set -euo pipefail
cd "$(dirname "$0")/.."

EXAMPLES="${SWITCHYARD_SCHEMATHESIS_EXAMPLES:-25}"
BIN="${SWITCHYARD_BIN:-target/debug/switchyard}"
VENV=target/schemathesis-venv
OUT=target/schemathesis
ST="$PWD/$VENV/bin/st"

if [ ! -x "$ST" ]; then
  echo "schemathesis: installing into $VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet 'schemathesis>=4.3,<5'
fi
if [ ! -x "$BIN" ]; then
  cargo build --locked -p switchyard-broker
fi

rm -rf "$OUT"
mkdir -p "$OUT"
DATA=$(mktemp -d)
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
BASE="http://127.0.0.1:$PORT"
cat >"$DATA/switchyard.toml" <<EOF
listen = "127.0.0.1:$PORT"
data_dir = "$DATA"
heartbeat_interval_s = 1
lease_ttl_s = 10
grace_s = 2
scheduler_tick_ms = 200

[[regions]]
id = "onprem:st-dc"
latency_ms = 1

[[pools]]
id = "st-h100"
region = "onprem:st-dc"
gpu_model = "H100"
gpus_per_node = 4
gpu_memory_gb = 80
price_per_gpu_hour_usd = 2.0
node_limit = 4
EOF

"$BIN" --json-logs serve --config "$DATA/switchyard.toml" >"$OUT/broker.log" 2>&1 &
BROKER=$!
cleanup() {
  kill "$BROKER" 2>/dev/null || true
  wait "$BROKER" 2>/dev/null || true
  rm -rf "$DATA"
}
trap cleanup EXIT

for _ in $(seq 1 150); do
  if curl -fsS "$BASE/healthz" >/dev/null 2>&1 && [ -s "$DATA/admin.token" ]; then break; fi
  if ! kill -0 "$BROKER" 2>/dev/null; then
    cat "$OUT/broker.log" >&2
    echo "schemathesis: the broker exited at start-up" >&2
    exit 1
  fi
  sleep 0.2
done
ADMIN=$(cat "$DATA/admin.token")

token() { # role [team]
  local body
  if [ -n "${2:-}" ]; then body="{\"role\":\"$1\",\"team\":\"$2\",\"name\":\"st-$1\"}"
  else body="{\"role\":\"$1\",\"name\":\"st-$1\"}"; fi
  curl -fsS -X POST "$BASE/api/v1/tokens" -H "Authorization: Bearer $ADMIN" \
    -H 'Content-Type: application/json' -d "$body" | jq -r .token
}
declare -A TOKENS=(
  [admin]="$ADMIN"
  [infra]="$(token infra)"
  [finance]="$(token finance)"
  [developer]="$(token developer ml)"
)

# Something to find: a job of the developer's team, and a policy.
curl -fsS -X POST "$BASE/api/v1/jobs" -H "Authorization: Bearer ${TOKENS[developer]}" \
  -H 'Content-Type: application/json' \
  -d '{"name":"seed","team":"ml","command":["sleep","1"],"resources":{"gpus":1}}' >/dev/null

CHECKS=not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance
failed=()
start=$(date +%s)
ROLES="${SWITCHYARD_SCHEMATHESIS_ROLES:-admin infra finance developer}"
for role in $ROLES; do
  echo "schemathesis: $role"
  t0=$(date +%s)
  set +e
  # From $OUT: schemathesis keeps a `.schemathesis/` cache in its working directory.
  (cd "$OUT" && "$ST" run "$BASE/openapi.json" --url "$BASE/api/v1" \
    -H "Authorization: Bearer ${TOKENS[$role]}" \
    --checks "$CHECKS" --max-examples "$EXAMPLES" --workers 2 --seed 7 \
    --phases examples,coverage,fuzzing --generation-database none \
    --request-timeout 10 --no-color --output-truncate true --continue-on-failure \
    --report junit --report-junit-path "$role.xml" >"$role.log" 2>&1)
  rc=$?
  set -e
  summary=$(grep -E '^ +[0-9]+ generated' "$OUT/$role.log" | tail -1 | sed 's/^ *//' || true)
  echo "schemathesis: $role exit $rc in $(( $(date +%s) - t0 )) s: $summary"
  if [ "$rc" -ne 0 ]; then
    failed+=("$role")
    sed -n '/FAILURES/,$p' "$OUT/$role.log" | head -n 150
  fi
done
echo "schemathesis: $(( $(date +%s) - start )) s for the roles $ROLES"

# A 5xx is a failure even when its body matched the spec: the broker logs each one (JSON
# lines, `"status":5xx`), and a panic in a handler.
if grep -qE '"status":5[0-9][0-9]|panicked' "$OUT/broker.log"; then
  echo "schemathesis: the broker logged server errors:" >&2
  grep -E '"status":5[0-9][0-9]|panicked' "$OUT/broker.log" | head -n 20 >&2
  failed+=("server errors in the broker log")
fi
if [ "${#failed[@]}" -ne 0 ]; then
  echo "schemathesis: FAILED for ${failed[*]} (logs in $OUT)" >&2
  exit 1
fi
echo "schemathesis: passed for every role"

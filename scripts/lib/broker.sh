# Sourced by the scripts that test a real broker (schemathesis.sh, openapi-check.sh): starts
# `switchyard serve` on 127.0.0.1 and a free port with a fresh data directory (SQLite) and the one
# on-prem pool of the end-to-end tests, no agents (so jobs wait in the queue), and stops it and
# removes the directory at exit.
#
#   start_broker LOG      sets BASE (http://127.0.0.1:PORT), BROKER_DATA, BROKER_PID, ADMIN_TOKEN
#   mint_token ROLE [TEAM]  prints a new API token of that role (and team), made with ADMIN_TOKEN
#
# The binary is $SWITCHYARD_BIN, by default the debug build (built when missing, with the whole
# workspace's features: see scripts/check-features.sh).

start_broker() {
  local log=$1
  local bin="${SWITCHYARD_BIN:-target/debug/switchyard}"
  if [ ! -x "$bin" ]; then
    cargo build --locked --workspace
  fi
  BROKER_DATA=$(mktemp -d)
  local port
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  BASE="http://127.0.0.1:$port"
  cat >"$BROKER_DATA/switchyard.toml" <<TOML
listen = "127.0.0.1:$port"
data_dir = "$BROKER_DATA"
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
TOML
  "$bin" --json-logs serve --config "$BROKER_DATA/switchyard.toml" >"$log" 2>&1 &
  BROKER_PID=$!
  trap stop_broker EXIT
  local _
  for _ in $(seq 1 150); do
    if curl -fsS "$BASE/healthz" >/dev/null 2>&1 && [ -s "$BROKER_DATA/admin.token" ]; then
      ADMIN_TOKEN=$(cat "$BROKER_DATA/admin.token")
      return 0
    fi
    if ! kill -0 "$BROKER_PID" 2>/dev/null; then
      cat "$log" >&2
      echo "the broker exited at start-up" >&2
      return 1
    fi
    sleep 0.2
  done
  cat "$log" >&2
  echo "the broker did not answer /healthz within 30 s" >&2
  return 1
}

stop_broker() {
  if [ -n "${BROKER_PID:-}" ]; then
    kill "$BROKER_PID" 2>/dev/null || true
    wait "$BROKER_PID" 2>/dev/null || true
  fi
  if [ -n "${BROKER_DATA:-}" ]; then rm -rf "$BROKER_DATA"; fi
}

mint_token() { # role [team]
  local body
  if [ -n "${2:-}" ]; then body="{\"role\":\"$1\",\"team\":\"$2\",\"name\":\"test-$1\"}"
  else body="{\"role\":\"$1\",\"name\":\"test-$1\"}"; fi
  curl -fsS -X POST "$BASE/api/v1/tokens" -H "Authorization: Bearer $ADMIN_TOKEN" \
    -H 'Content-Type: application/json' -d "$body" | jq -r .token
}

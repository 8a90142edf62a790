#!/usr/bin/env bash
# Schemathesis (property-based API testing, from PyPI) against a real `switchyard serve` and
# its own `/openapi.json`, once per role (admin, infra, finance, developer): no 5xx, and every
# response documented (status code, content type, body schema).
#
#   scripts/schemathesis.sh                 the debug binary (target/debug/switchyard)
#   SWITCHYARD_BIN=target/release/switchyard SWITCHYARD_SCHEMATHESIS_EXAMPLES=200 scripts/schemathesis.sh
#
# Installs schemathesis into a virtual environment under target/ when missing. The broker
# (scripts/lib/broker.sh) runs on 127.0.0.1 and a free port with a fresh data directory (SQLite),
# with the one on-prem pool of the end-to-end tests; it is stopped and removed at exit. Reports
# (JUnit, and the broker's log) go to target/schemathesis/.
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
rm -rf "$OUT"
mkdir -p "$OUT"
# shellcheck source=scripts/lib/broker.sh
. scripts/lib/broker.sh
SWITCHYARD_BIN="$BIN" start_broker "$OUT/broker.log"
declare -A TOKENS=(
  [admin]="$ADMIN_TOKEN"
  [infra]="$(mint_token infra)"
  [finance]="$(mint_token finance)"
  [developer]="$(mint_token developer ml)"
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

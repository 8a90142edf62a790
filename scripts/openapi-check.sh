#!/usr/bin/env bash
# The API contract, checked against a real `switchyard serve` (scripts/lib/broker.sh):
#
# 1. its served /openapi.json is valid OpenAPI 3.1 (openapi-spec-validator: every error fails);
# 2. a Python client generated from it (openapi-python-client; no generator warning allowed)
#    imports and type-checks (mypy --strict, with the program below), and
# 3. drives the broker (scripts/openapi_client_check.py): submits a job (and retries it with its
#    Idempotency-Key), reads it, lists it, cancels it and reads it cancelled, and meets 401, 404
#    and 409 as the typed error bodies the document promises; any status the document does not
#    list for an operation fails it.
#
#   scripts/openapi-check.sh                the debug binary (target/debug/switchyard)
#   SWITCHYARD_BIN=target/release/switchyard scripts/openapi-check.sh
#
# Installs the validator and the generator (from PyPI) into a virtual environment under target/
# when missing. The document, the generated client, the validator's report and the broker's log
# go to target/openapi/. Generated code is never edited: a change belongs in the handlers'
# annotations or in broker/src/http/api/openapi.rs.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=target/openapi-venv
OUT=target/openapi
PACKAGE=switchyard_client
# Bump together; the stamp makes an older venv reinstall.
REQUIREMENTS=('openapi-spec-validator>=0.9,<0.10' 'openapi-python-client>=0.29,<0.30' 'mypy>=1.18,<2')
STAMP="$VENV/.requirements"

if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$STAMP" 2>/dev/null)" != "${REQUIREMENTS[*]}" ]; then
  echo "openapi-check: installing ${REQUIREMENTS[*]} into $VENV"
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet "${REQUIREMENTS[@]}"
  printf '%s' "${REQUIREMENTS[*]}" >"$STAMP"
fi
# The generator runs ruff (installed with it) on what it writes.
export PATH="$PWD/$VENV/bin:$PATH"

rm -rf "$OUT"
mkdir -p "$OUT/client"
# shellcheck source=scripts/lib/broker.sh
. scripts/lib/broker.sh
start_broker "$OUT/broker.log"
start=$(date +%s)

curl -fsS "$BASE/openapi.json" -o "$OUT/openapi.json"

echo "openapi-check: validating /openapi.json (OpenAPI $(jq -r .openapi "$OUT/openapi.json"))"
if ! openapi-spec-validator --validation-errors all "$OUT/openapi.json" >"$OUT/validator.log" 2>&1; then
  head -n 80 "$OUT/validator.log" >&2
  echo "openapi-check: /openapi.json is not valid: $(tail -n 1 "$OUT/validator.log") (all of them in $OUT/validator.log)" >&2
  exit 1
fi
cat "$OUT/validator.log"

echo "openapi-check: generating a Python client with openapi-python-client"
if ! openapi-python-client generate --path "$OUT/openapi.json" --meta none \
  --output-path "$OUT/client/$PACKAGE" >"$OUT/generator.log" 2>&1; then
  cat "$OUT/generator.log" >&2
  echo "openapi-check: the generator failed" >&2
  exit 1
fi
# It skips what it cannot generate with a warning and exits 0: a skipped operation is a failure.
if grep -qiE 'warning|error|skipping' "$OUT/generator.log"; then
  cat "$OUT/generator.log" >&2
  echo "openapi-check: the generator warned; the client would be incomplete" >&2
  exit 1
fi

echo "openapi-check: type-checking the client and the program that drives it (mypy --strict)"
MYPYPATH="$OUT/client" mypy --config-file scripts/openapi-mypy.ini --no-error-summary \
  "$OUT/client/$PACKAGE" scripts/openapi_client_check.py

echo "openapi-check: driving the broker with the generated client"
DEVELOPER_TOKEN=$(mint_token developer ml)
PYTHONPATH="$OUT/client" SWITCHYARD_URL="$BASE" SWITCHYARD_TOKEN="$DEVELOPER_TOKEN" \
  timeout 120 python scripts/openapi_client_check.py

# A 5xx is a failure even where the document lists it.
if grep -qE '"status":5[0-9][0-9]|panicked' "$OUT/broker.log"; then
  echo "openapi-check: the broker logged server errors:" >&2
  grep -E '"status":5[0-9][0-9]|panicked' "$OUT/broker.log" | head -n 20 >&2
  exit 1
fi
echo "openapi-check: passed in $(( $(date +%s) - start )) s"

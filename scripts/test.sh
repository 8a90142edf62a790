#!/usr/bin/env bash
# The one test command: formatting, lints, then every test in the workspace — core unit and
# property tests, broker API tests on a real router and SQLite, agent and provider tests with
# real processes, and end-to-end tests that start the real `switchyard` and `switchyard-agent`
# binaries.
#
# It installs what the tests need when it is missing: the Rust toolchain's own components and
# the EC2 emulator (moto) the AWS provider tests start, and Chromium with chromedriver for the
# console's browser tests; schemathesis, openapi-spec-validator and openapi-python-client go into
# virtual environments under target/; PostgreSQL joins here with the suites that use it.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

# The AWS provider tests (providers/tests/aws_moto.rs) start `moto_server` themselves.
ensure_moto() {
  if ! command -v moto_server >/dev/null 2>&1; then
    step "installing moto (EC2 emulator for the AWS provider tests)"
    # `pip` rather than `python3 -m pip`: under pyenv its shim also rehashes the new script.
    if command -v pip >/dev/null 2>&1; then pip install --quiet 'moto[server]'
    else python3 -m pip install --quiet 'moto[server]'; fi
    command -v moto_server >/dev/null 2>&1 || {
      echo "moto_server is not on PATH after installing moto" >&2
      exit 1
    }
  fi
}

# The console's browser tests (tests/tests/console.rs) drive Debian's Chromium through
# chromedriver; they fail when these are missing (or skip with SWITCHYARD_SKIP_BROWSER=1).
ensure_chromium() {
  if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then
    step "installing chromium and chromium-driver (browser tests of the console)"
    local sudo=""
    if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
    $sudo apt-get update
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y chromium chromium-driver
    if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then
      echo "chromium or chromedriver is missing after installing them" >&2
      exit 1
    fi
  fi
}

if ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
  step "installing rustfmt and clippy"
  rustup component add rustfmt clippy
fi

step "cargo fmt --check"
cargo fmt --all -- --check

# One feature set per crate: `cargo run --release -- up` after a workspace build rebuilds nothing.
step "features: the broker alone resolves as in --workspace"
scripts/check-features.sh

step "cargo clippy (all targets, warnings are errors)"
cargo clippy --workspace --all-targets --locked -- -D warnings

# Every build below is `--workspace`: cargo resolves features per set of selected packages, so
# `-p switchyard-broker` after `--workspace` would rebuild tokio, sqlx and aws-sdk-ec2 with other
# features (minutes each, and a second copy of every test binary on disk). CI starts cold and
# gets neither incremental nor debug-info files (see [profile.dev] in Cargo.toml).
export CARGO_INCREMENTAL=0

# `cargo test --no-run` also builds the `switchyard` and `switchyard-agent` binaries the
# end-to-end tests start (both packages have integration tests), with the tests' features.
step "building the tests and the binaries the end-to-end tests start"
cargo test --workspace --locked --no-run

ensure_moto
if [ "${SWITCHYARD_SKIP_BROWSER:-}" != "1" ]; then ensure_chromium; fi

step "cargo test (workspace)"
cargo test --workspace --locked

# Hostile input: the cargo-fuzz targets of tests/fuzz, each for a bounded time (a crash fails;
# skipped, with a line saying so, without a nightly toolchain), then schemathesis (installed
# into target/ when missing) against a real broker's /openapi.json with each role's token.
step "cargo fuzz (${SWITCHYARD_FUZZ_SECONDS:-60} s per target)"
scripts/fuzz.sh
step "schemathesis against /openapi.json (every role)"
scripts/schemathesis.sh
# The contract itself: /openapi.json passes openapi-spec-validator (OpenAPI 3.1), and a Python
# client generated from it (openapi-python-client, both installed into target/ when missing)
# type-checks and submits, reads, lists and cancels a job on a real broker.
step "openapi: validate /openapi.json, generate a client, drive a broker with it"
scripts/openapi-check.sh

# The broker's suites again on PostgreSQL: a throwaway PostgreSQL 15 cluster (Debian's binaries,
# initdb as the postgres user, a loopback port, its socket in a temp dir, fsync off), one fresh
# database per test broker (tests/common), stopped and removed at exit, on failure too.
step "cargo test (broker on PostgreSQL)"
PGBIN=/usr/lib/postgresql/15/bin
PG_DIR=$(mktemp -d)
stop_postgres() {
  if [ -f "$PG_DIR/data/postmaster.pid" ]; then
    runuser -u postgres -- "$PGBIN/pg_ctl" -D "$PG_DIR/data" -m immediate stop >/dev/null 2>&1 || true
  fi
  rm -rf "$PG_DIR"
}
trap stop_postgres EXIT
chown postgres "$PG_DIR"
PG_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
runuser -u postgres -- "$PGBIN/initdb" -D "$PG_DIR/data" -U postgres -A trust --no-sync -E UTF8 >/dev/null
runuser -u postgres -- "$PGBIN/pg_ctl" -D "$PG_DIR/data" -l "$PG_DIR/log" -w \
  -o "-p $PG_PORT -k $PG_DIR -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200" start
BROKER_TESTS=()
for f in broker/tests/*.rs; do BROKER_TESTS+=(--test "$(basename "$f" .rs)"); done
SWITCHYARD_TEST_PG_URL="postgres://postgres@127.0.0.1:$PG_PORT" \
  cargo test --workspace --locked "${BROKER_TESTS[@]}"

# Two `switchyard serve` replicas on that cluster: kill -9 the leader under load (jobs; and a
# service answering through a standalone gateway); and one
# broker killed -9 under 1,000+ submissions and restarted (the crash test's PostgreSQL variant).
step "cargo test (replica failover and broker crash on PostgreSQL)"
SWITCHYARD_TEST_PG_URL="postgres://postgres@127.0.0.1:$PG_PORT" \
  cargo test --workspace --locked --test failover --test crash --test service_failover \
  -- --nocapture killing_the_leader on_postgres

step "all tests passed"

#!/usr/bin/env bash
# The one test command: formatting, lints, then every test in the workspace — core unit and
# property tests, broker API tests on a real router and SQLite, agent and provider tests with
# real processes, and end-to-end tests that start the real `switchyard` and `switchyard-agent`
# binaries.
#
# It installs what the tests need when it is missing: the Rust toolchain's own components and
# the EC2 emulator (moto) the AWS provider tests start; Chromium and PostgreSQL join here with
# the suites that use them.
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

if ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
  step "installing rustfmt and clippy"
  rustup component add rustfmt clippy
fi

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy (all targets, warnings are errors)"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "building the binaries the end-to-end tests start"
cargo build --locked -p switchyard-broker -p switchyard-agent

ensure_moto

step "cargo test (workspace)"
cargo test --workspace --locked

step "all tests passed"

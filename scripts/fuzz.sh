#!/usr/bin/env bash
# Runs the cargo-fuzz targets of tests/fuzz, each for a bounded time, and fails on the first
# crash (a panic, a failed assertion, a hang past the timeout, or memory past the limit).
#
#   scripts/fuzz.sh                  every target, SWITCHYARD_FUZZ_SECONDS each (default 60)
#   scripts/fuzz.sh job_spec         one target
#   SWITCHYARD_FUZZ_SECONDS=600 scripts/fuzz.sh trace_reader
#
# Targets: job_spec (a submitted job through the broker's JSON reader, validation, storage
# and one plan), agent_protocol (every agent protocol message, both ways, and the rules the
# broker and the agent apply to it), trace_reader (a trace in every --trace-format, plain or
# gzip, and the scenario TOML of `switchyard simulate`, with a short replay).
#
# cargo-fuzz needs a nightly toolchain: without one this prints a line saying the fuzz step
# was skipped and exits 0. cargo-fuzz itself is installed from crates.io when missing.
# Seeds (real inputs) are in tests/fuzz/seeds/TARGET and stay read-only; what the fuzzer
# learns goes to tests/fuzz/corpus/TARGET (git-ignored, kept between runs); a crashing input
# is written to tests/fuzz/artifacts/TARGET/ and the command that reproduces it is printed.
#
# Built without a sanitizer (`-s none`): every crate of the workspace forbids unsafe code, so
# AddressSanitizer would only slow the build and the runs; panics and overflow checks (on in
# cargo-fuzz builds) are what these targets look for.
set -euo pipefail
cd "$(dirname "$0")/.."

SECS="${SWITCHYARD_FUZZ_SECONDS:-60}"
ALL_TARGETS=(job_spec agent_protocol trace_reader)
if [ "$#" -gt 0 ]; then TARGETS=("$@"); else TARGETS=("${ALL_TARGETS[@]}"); fi

if ! rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
  echo "fuzz: SKIPPED: no nightly Rust toolchain (cargo-fuzz needs one: rustup toolchain install nightly)"
  exit 0
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
  echo "fuzz: installing cargo-fuzz"
  cargo install cargo-fuzz --locked
fi

cd tests/fuzz
# The workspace's own lock file: the targets build the same dependency versions as the
# product (cargo adds libfuzzer-sys to the copy).
cp ../../Cargo.lock Cargo.lock
build_start=$(date +%s)
mkdir -p target
if ! cargo +nightly fuzz build -s none >target/fuzz-build.log 2>&1; then
  tail -n 60 target/fuzz-build.log
  echo "fuzz: the build failed (log: tests/fuzz/target/fuzz-build.log)" >&2
  exit 1
fi
echo "fuzz: built in $(( $(date +%s) - build_start )) s"
BIN_DIR="target/$(rustc +nightly -vV | sed -n 's/^host: //p')/release"

summary=()
for t in "${TARGETS[@]}"; do
  mkdir -p "corpus/$t" "artifacts/$t"
  log="artifacts/$t/last-run.log"
  echo "fuzz: $t for ${SECS} s"
  set +e
  # The binary `cargo fuzz build` made, run directly (`cargo fuzz run` would rebuild it when
  # another checkout's edits touched its sources meanwhile).
  "$BIN_DIR/$t" "corpus/$t" "seeds/$t" -artifact_prefix="artifacts/$t/" \
    -max_total_time="$SECS" -timeout=10 -rss_limit_mb=2048 -max_len=8192 \
    -print_final_stats=1 >"$log" 2>&1
  rc=$?
  set -e
  # (`|| true`: a run that crashed on a seed has no coverage line, and grep's miss would end
  # this script under pipefail before it prints the crash.)
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  cov=$( (grep -o 'cov: [0-9]*' "$log" || true) | tail -1 | cut -d' ' -f2)
  if [ "$rc" -ne 0 ]; then
    tail -n 60 "$log"
    artifact=$(grep -o 'artifacts/[^ ]*' "$log" | grep -v last-run | tail -1 || true)
    echo "fuzz: $t FAILED (exit $rc) after ${execs:-?} executions" >&2
    if [ -n "$artifact" ]; then
      echo "fuzz: reproduce with: (cd tests/fuzz && cargo +nightly fuzz run -s none $t $artifact)" >&2
      echo "fuzz: the input is kept in tests/fuzz/$artifact" >&2
    fi
    exit 1
  fi
  summary+=("$(printf '%-15s %10s executions in %4s s  (%s exec/s, coverage %s)' \
    "$t" "${execs:-?}" "$SECS" "${speed:-?}" "${cov:-?}")")
done

echo "fuzz: no crashes"
printf '  %s\n' "${summary[@]}"

#!/usr/bin/env bash
# Alternates two builds on the placement speed targets, so that a noisy shared machine moves
# both alike: the whole Philly trace under all three schedulers (wall seconds), `plan` over
# 10,000 jobs (criterion), and `place` p50/p99 over 10,000 placements, each build in turn.
#
#   scripts/bench-compare.sh BASE_SWITCHYARD BASE_BENCH NEW_SWITCHYARD NEW_BENCH
#
# The bench binaries are what `cargo bench -p switchyard-core --bench plan --no-run` prints;
# copy each build's binaries aside first (a `git worktree` builds the base).
set -euo pipefail
if [ $# -ne 4 ]; then
  echo "usage: $0 BASE_SWITCHYARD BASE_BENCH NEW_SWITCHYARD NEW_BENCH" >&2
  exit 2
fi
declare -A sw=([base]=$1 [new]=$3) bench=([base]=$2 [new]=$4)
trace="$(dirname "$0")/../../shared/data/traces/philly_dirlab15k_jobs.csv.gz"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
uptime
for run in 1 2; do
  for b in base new; do
    start=$(date +%s.%N)
    "${sw[$b]}" simulate --trace "$trace" --out "$out/$b" >/dev/null 2>"$out/$b.log"
    echo "simulate $b run $run: $(echo "$(date +%s.%N) - $start" | bc) s"
  done
done
for run in 1 2; do
  for b in base new; do
    echo "plan $b run $run: $("${bench[$b]}" --bench 'plan/10000j_1000p_10000n$' \
      --warm-up-time 1 --measurement-time 4 --noplot 2>&1 | grep 'time:' | head -1)"
  done
done
for run in 1 2 3; do
  for b in base new; do
    echo "place $b run $run: $("${bench[$b]}" --bench '^none$' 2>&1 | grep -o 'p50.*')"
  done
done
uptime

#!/usr/bin/env bash
# Replays every shared trace under the default scenario and each of scenarios/ with one
# top-level scenario key set to each of several values, Switchyard only (told its predicted
# runtimes, as in sim-all.sh), and prints one table: cost ÷ LP bound, cost, deadlines met and
# bursts per trace, scenario and value. For justifying a default against every trace rather
# than one (issue 29), e.g. the on-prem reserve's threshold:
#
#   scripts/sim-sweep.sh reserve_free_below_one_in 0 4 8 16 [--out DIR] [--bin PATH]
#
# The key is written at the top of a copy of each scenario (so it stays a top-level key).
# Builds the release binary when --bin is not given; reports stay under DIR (default
# /tmp/sim-sweep)/<trace>/<scenario>/<value>/, the table also in DIR/table.md.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ $# -lt 2 ]]; then
  echo "usage: $0 KEY VALUE... [--out DIR] [--bin PATH]" >&2
  exit 2
fi
key="$1"
shift
values=()
out=/tmp/sim-sweep
bin=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --bin) bin="$2"; shift 2 ;;
    *) values+=("$1"); shift ;;
  esac
done
source scripts/lib/sim.sh
bin=$(sim_bin "$bin")
traces=("${SIM_TRACES[@]}")
scenarios=("${SIM_SCENARIOS[@]}")

mkdir -p "$out"
for t in "${traces[@]}"; do
  IFS=: read -r name format path <<<"$t"
  for s in "${scenarios[@]}"; do
    sname=$(basename "$s" .toml)
    for v in "${values[@]}"; do
      dir="$out/$name/$sname/$v"
      mkdir -p "$dir"
      {
        echo "$key = $v"
        [[ "$s" != default ]] && cat "$s"
      } > "$dir/scenario.toml"
      echo "== $name / $sname / $key = $v" >&2
      "$bin" simulate --trace "$path" --trace-format "$format" --estimates predicted \
        --scheduler switchyard --scenario "$dir/scenario.toml" --out "$dir" \
        2> "$dir/stderr.txt" || {
        echo "   failed: see $dir/stderr.txt" >&2
        tail -3 "$dir/stderr.txt" >&2
      }
    done
  done
done

python3 - "$out" "$key" <<'EOF' | tee "$out/table.md"
import json, pathlib, sys

out, key = pathlib.Path(sys.argv[1]), sys.argv[2]
print(f"| trace | scenario | {key} | cost ÷ LP bound | cost | deadlines met | bursts |")
print("|---|---|---:|---:|---:|---:|---:|")
for report in sorted(out.glob("*/*/*/report.json"),
                     key=lambda p: (p.parent.parent.parent.name, p.parent.parent.name,
                                    float(p.parent.name))):
    r = json.loads(report.read_text())
    sy = r["schedulers"]["switchyard"]
    lb = r["lp_lower_bound_usd"]
    ratio = sy["total_cost_usd"] / lb if lb > 0 else float("inf")
    print(f"| {report.parent.parent.parent.name} | {report.parent.parent.name} | "
          f"{report.parent.name} | {ratio:.3f} | ${sy['total_cost_usd']:,.0f} | "
          f"{sy['deadline_met_fraction'] * 100:.2f} % | {sy['burst_instances']} |")
EOF

#!/usr/bin/env bash
# Replays every shared trace under the default scenario and each scenario in scenarios/, and
# prints one table: Switchyard's cost ÷ the LP lower bound, how far below the cheapest-offer
# peer it is, its deadlines met against the best peer's, and its cost under predicted
# runtimes against the oracle's (issue 29's goals; each row must meet them all).
#
#   scripts/sim-all.sh [--helios PATH] [--swf PATH] [--out DIR] [--bin PATH]
#
# --helios / --swf add a Helios-style `cluster_log.csv` or a Standard Workload Format file
# (replayed as `--trace-format helios|swf`). Builds the release binary when --bin is not
# given. Each replay's report.json is kept under DIR/<trace>/<scenario>/; the table also goes
# to DIR/table.md.
set -euo pipefail
cd "$(dirname "$0")/.."

out=/tmp/sim-all
bin=""
extra=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --helios) extra+=("helios:helios:$2"); shift 2 ;;
    --swf) extra+=("swf:swf:$2"); shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --bin) bin="$2"; shift 2 ;;
    *) echo "unknown argument: $1 (see the comment at the top of $0)" >&2; exit 2 ;;
  esac
done
source scripts/lib/sim.sh
bin=$(sim_bin "$bin")
traces=("${SIM_TRACES[@]}" "${extra[@]}")
scenarios=("${SIM_SCENARIOS[@]}")

mkdir -p "$out"
for t in "${traces[@]}"; do
  IFS=: read -r name format path <<<"$t"
  for s in "${scenarios[@]}"; do
    sname=$(basename "$s" .toml)
    dir="$out/$name/$sname"
    mkdir -p "$dir"
    args=(simulate --trace "$path" --trace-format "$format" --estimates all --out "$dir")
    [[ "$s" != default ]] && args+=(--scenario "$s")
    echo "== $name / $sname" >&2
    "$bin" "${args[@]}" 2> "$dir/stderr.txt" || {
      echo "   failed: see $dir/stderr.txt" >&2
      tail -3 "$dir/stderr.txt" >&2
    }
  done
done

python3 - "$out" <<'EOF' | tee "$out/table.md"
import json, pathlib, sys

out = pathlib.Path(sys.argv[1])
rows = []
for report in sorted(out.glob("*/*/report.json")):
    r = json.loads(report.read_text())
    s = r["schedulers"]
    sy = s["switchyard"]
    lb = r["lp_lower_bound_usd"]
    peers = {k: v for k, v in s.items() if k in ("cheapest", "fifo-burst")}
    best = max(v["deadline_met_fraction"] for v in peers.values())
    cheapest = s["cheapest"]["total_cost_usd"]
    oracle = s.get("switchyard-oracle")
    ratio = sy["total_cost_usd"] / lb if lb > 0 else float("inf")
    below = 1 - sy["total_cost_usd"] / cheapest
    vs_oracle = sy["total_cost_usd"] / oracle["total_cost_usd"] - 1 if oracle else None
    est = r.get("estimates") or {}
    pred = est.get("predicted") or {}
    user = est.get("user") or {}
    goals = [
        ratio <= 1.10,
        below >= 0.25,
        sy["deadline_met_fraction"] >= best,
        vs_oracle is not None and vs_oracle <= 0.03
        and sy["deadline_met_fraction"] >= oracle["deadline_met_fraction"] - 1e-9,
    ]
    rows.append([
        report.parent.parent.name,
        report.parent.name,
        f"{r['trace']['measured_jobs']}",
        f"{ratio:.3f}",
        f"{below * 100:.1f} %",
        f"{sy['deadline_met_fraction'] * 100:.2f} % / {best * 100:.2f} %",
        (f"{vs_oracle * 100:+.1f} % ({oracle['deadline_met_fraction'] * 100:.2f} %)"
         if oracle else "–"),
        f"{user.get('median_abs_pct_error', 0) * 100:.0f} % / {pred.get('median_abs_pct_error', 0) * 100:.0f} %",
        "yes" if all(goals) else "**no** (" + ", ".join(
            n for n, ok in zip(["bound", "cheapest", "deadlines", "oracle"], goals) if not ok) + ")",
    ])
head = ["trace", "scenario", "measured jobs", "cost ÷ LP bound (≤ 1.10)",
        "below cheapest (≥ 25 %)", "deadlines met: Switchyard / best peer",
        "cost vs oracle (≤ +3 %; oracle's deadlines)", "MdAPE: user / predicted", "all goals"]
print("| " + " | ".join(head) + " |")
print("|" + "---|" * len(head))
for row in rows:
    print("| " + " | ".join(row) + " |")

# The gap to the bound by cause, in dollars (report.json's `gap`, see GapAnatomy), for
# Switchyard told its predictions and told the truth.
print()
parts = [("cloud_idle_usd", "cloud idle"), ("fragmentation_usd", "fragmentation"),
         ("reruns_usd", "reruns"), ("burst_owned_full_usd", "burst, owned full"),
         ("burst_owned_free_usd", "burst, owned free"),
         ("dearer_usd", "dearer pool/market"), ("unfinished_usd", "unfinished"),
         ("capacity_usd", "− bound's capacity share")]
head = ["trace", "scenario", "run", "LP bound", "gap"] + [p[1] for p in parts]
print("| " + " | ".join(head) + " |")
print("|" + "---|" * len(head))
for report in sorted(out.glob("*/*/report.json")):
    r = json.loads(report.read_text())
    for run in ("switchyard", "switchyard-oracle"):
        g = r["schedulers"].get(run, {}).get("gap")
        if not g:
            continue
        cells = [report.parent.parent.name, report.parent.name,
                 "predicted" if run == "switchyard" else "oracle",
                 f"${r['lp_lower_bound_usd']:,.0f}", f"${g['gap_usd']:,.0f}"]
        cells += [f"${g[k]:,.0f}" for k, _ in parts]
        print("| " + " | ".join(cells) + " |")
EOF

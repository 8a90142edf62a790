#!/usr/bin/env bash
# One feature set per crate: the broker alone (the default member, what `cargo run --release --
# up` builds) must resolve every dependency it shares with the whole workspace (`cargo build
# --release --workspace`, `scripts/test.sh`) with the same features. Cargo unifies features over
# the packages a command selects, so a feature that only another member turns on makes the
# broker's own build a different one, and `cargo run` after a workspace build rebuilds that
# crate and everything above it. Compares `cargo tree -e normal,build` (features per crate) for
# the two selections and fails naming each crate whose features differ; the usual fix is to name
# that feature in the broker's dependencies (see `bitflags` in the root Cargo.toml).
set -euo pipefail
export LC_ALL=C
cd "$(dirname "$0")/.."

# "name version feature,list" per crate and build side (host or target), without markers.
features() {
  cargo tree --locked -e normal,build --prefix none -f '{p} {f}' "$@" |
    sed -E -e 's/ \(\*\)$//' -e 's/ \(proc-macro\)//' -e 's/ \([^)]*\)//' |
    awk 'NF { print $1 "@" $2, ($3 == "" ? "no features" : $3) }' | sort -u
}
# "name@version|features; features..." per crate: every feature set it is built with (a crate
# built for the host, for build scripts and proc macros, and for the target has two).
by_crate() {
  awk '{ k = $1; sub(/^[^ ]+ /, ""); sets[k] = (n[k]++ ? sets[k] "; " : "") $0 }
       END { for (k in sets) print k "|" sets[k] }' | sort
}

default=$(features | by_crate)
workspace=$(features --workspace | by_crate)

# Crates both builds have, whose feature sets differ.
differ=$(join -t '|' <(printf '%s\n' "$default") <(printf '%s\n' "$workspace") |
  awk -F'|' '$2 != $3 { print $1 ": the broker alone builds it with [" $2 "], --workspace with [" $3 "]" }')

if [ -n "$differ" ]; then
  echo "check-features: the default member and --workspace build these crates with other features:" >&2
  printf '%s\n' "$differ" | sed 's/^/  /' >&2
  echo "check-features: name the missing features in broker/Cargo.toml (see bitflags in Cargo.toml)" >&2
  exit 1
fi
echo "check-features: the broker alone and --workspace build every crate they share with the same features ($(printf '%s\n' "$default" | wc -l) in the broker's build)"

# Layering: the broker's library never uses the agent's crate; only `switchyard agent`
# (broker/src/main.rs) runs it, so `up` needs one binary. What both need is in `support/`.
uses=$(grep -rlnw 'switchyard_agent' broker/src --include='*.rs' | grep -v '^broker/src/main\.rs$' || true)
if [ -n "$uses" ]; then
  echo "check-features: the broker's library uses switchyard_agent (move what it needs to support/):" >&2
  printf '  %s\n' $uses >&2
  exit 1
fi
echo "check-features: the broker's library does not use the agent's crate"

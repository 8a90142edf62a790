# Sourced by the scripts that replay the shared traces (sim-all.sh, sim-sweep.sh), from the
# repository root:
#
#   sim_bin BIN    prints BIN, or (BIN empty) builds the release binary and prints its path
#   SIM_TRACES     "name:format:path" of every shared trace
#   SIM_SCENARIOS  "default" (the built-in scenario) and each of scenarios/*.toml

sim_bin() {
  if [[ -n "$1" ]]; then
    echo "$1"
  else
    cargo build --release --workspace --bin switchyard >&2
    echo target/release/switchyard
  fi
}

SIM_DATA=../shared/data/traces
SIM_TRACES=(
  "philly:philly:$SIM_DATA/philly_dirlab15k_jobs.csv.gz"
  "bluewaters:bluewaters:$SIM_DATA/bluewaters_dirlab15k_jobs.csv.gz"
)
SIM_SCENARIOS=(default scenarios/*.toml)

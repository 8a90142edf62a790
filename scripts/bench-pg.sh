#!/usr/bin/env bash
# The load figures of BENCHMARKS.md "Load" on PostgreSQL, reproducibly: starts a throwaway
# PostgreSQL 15 cluster (Debian's binaries, initdb as the postgres user, a loopback port, its
# socket in a temp dir) with durable settings — fsync and synchronous_commit on, as PostgreSQL
# ships them — gives each phase a fresh database, runs target/release/bench-load on it, and
# stops and removes the cluster at exit.
#
#   scripts/bench-pg.sh                 submit, heartbeat and list
#   scripts/bench-pg.sh submit list     some phases
#   SWITCHYARD_BENCH_PG_FSYNC=off scripts/bench-pg.sh submit   the old, non-durable setting
#
# Build first: cargo build --release -p switchyard-broker -p switchyard-agent -p switchyard-tests
set -euo pipefail
cd "$(dirname "$0")/.."

PHASES=("$@")
[ "${#PHASES[@]}" -gt 0 ] || PHASES=(submit heartbeat list)
for bin in switchyard switchyard-agent bench-load; do
  [ -x "target/release/$bin" ] || {
    echo "bench-pg: target/release/$bin is missing; build with:" >&2
    echo "  cargo build --release -p switchyard-broker -p switchyard-agent -p switchyard-tests" >&2
    exit 1
  }
done

PGBIN=/usr/lib/postgresql/15/bin
FSYNC="${SWITCHYARD_BENCH_PG_FSYNC:-on}"
PG_DIR=$(mktemp -d)
stop_postgres() {
  if [ -f "$PG_DIR/data/postmaster.pid" ]; then
    runuser -u postgres -- "$PGBIN/pg_ctl" -D "$PG_DIR/data" -m fast stop >/dev/null 2>&1 || true
  fi
  rm -rf "$PG_DIR"
}
trap stop_postgres EXIT
chown postgres "$PG_DIR"
PG_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
runuser -u postgres -- "$PGBIN/initdb" -D "$PG_DIR/data" -U postgres -A trust -E UTF8 >/dev/null
runuser -u postgres -- "$PGBIN/pg_ctl" -D "$PG_DIR/data" -l "$PG_DIR/log" -w \
  -o "-p $PG_PORT -k $PG_DIR -c listen_addresses=127.0.0.1 -c fsync=$FSYNC \
      -c synchronous_commit=on -c max_connections=200" start >/dev/null
echo "bench-pg: PostgreSQL $("$PGBIN/postgres" --version | awk '{print $3}') on port $PG_PORT, fsync=$FSYNC, synchronous_commit=on"

for phase in "${PHASES[@]}"; do
  db="bench_${phase}_$$"
  runuser -u postgres -- "$PGBIN/createdb" -h "$PG_DIR" -p "$PG_PORT" -U postgres "$db"
  echo "bench-pg: $phase on database $db"
  SWITCHYARD_BENCH_DATABASE_URL="postgres://postgres@127.0.0.1:$PG_PORT/$db" \
    target/release/bench-load "$phase"
done

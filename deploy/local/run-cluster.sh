#!/usr/bin/env bash
# Starts a local skilleval cluster to try the system: builds the binaries, applies the schema,
# then runs one coordinator and N workers as local processes, logs in a folder. Ctrl-C stops
# them all (workers get SIGTERM and finish their in-flight jobs first).
#
#   deploy/local/run-cluster.sh [-n WORKERS] [-p PORT] [-l LOG_DIR] [--release]
#
# Needs PostgreSQL and RabbitMQ (deploy/local/ensure-services.sh starts them). Uses the
# database `skilleval` on 127.0.0.1 (created if missing) unless DATABASE_URL is set.
set -euo pipefail
cd "$(dirname "$0")/../.."

workers=2
port=8080
log_dir=${TMPDIR:-/tmp}/skilleval-cluster
profile=debug
while [ $# -gt 0 ]; do
    case $1 in
        -n|--workers) workers=$2; shift 2 ;;
        -p|--port) port=$2; shift 2 ;;
        -l|--logs) log_dir=$2; shift 2 ;;
        --release) profile=release; shift ;;
        -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
        *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
done

deploy/local/ensure-services.sh

export DATABASE_URL=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/skilleval}
export AMQP_URL=${AMQP_URL:-amqp://guest:guest@127.0.0.1:5672/%2f}
export RUST_LOG=${RUST_LOG:-info}
export SKILLEVAL__COORDINATOR__BIND=127.0.0.1:$port
export SKILLEVAL__COORDINATOR__PUBLIC_URL=http://127.0.0.1:$port
export SKILLEVAL_LOG_FORMAT=${SKILLEVAL_LOG_FORMAT:-text}
export SKILLEVAL__COORDINATOR__WEBHOOK_SECRET=${SKILLEVAL__COORDINATOR__WEBHOOK_SECRET:-local-dev-secret}

db_name=${DATABASE_URL##*/}
db_name=${db_name%%\?*}
admin_url="${DATABASE_URL%/*}/postgres"
if ! psql "$admin_url" -tAc "SELECT 1 FROM pg_database WHERE datname = '$db_name'" | grep -q 1; then
    echo "creating database $db_name"
    psql "$admin_url" -qc "CREATE DATABASE \"$db_name\""
fi

echo "building ($profile)"
cargo_flags=()
[ "$profile" = release ] && cargo_flags+=(--release)
cargo build "${cargo_flags[@]}" -p skilleval-coordinator -p skilleval-worker
bin=${CARGO_TARGET_DIR:-target}/$profile

mkdir -p "$log_dir"
"$bin/skilleval-coordinator" migrate

pids=()
stop_all() {
    trap - INT TERM EXIT
    echo
    echo "stopping ${#pids[@]} processes (workers finish their in-flight jobs)"
    for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    echo "stopped; logs are in $log_dir"
}
trap stop_all INT TERM EXIT

"$bin/skilleval-coordinator" serve >"$log_dir/coordinator.log" 2>&1 &
pids+=($!)
for i in $(seq 1 "$workers"); do
    SKILLEVAL__WORKER__HTTP_PORT=$((9090 + i)) "$bin/skilleval-worker" >"$log_dir/worker-$i.log" 2>&1 &
    pids+=($!)
done

for _ in $(seq 1 60); do
    curl -fsS "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break
    sleep 0.5
done

cat <<INFO
skilleval is running: 1 coordinator, $workers worker(s)
  API        http://127.0.0.1:$port/v1   (OpenAPI: http://127.0.0.1:$port/v1/openapi.json)
  health     http://127.0.0.1:$port/readyz   metrics: http://127.0.0.1:$port/metrics
  workers    http://127.0.0.1:9091/metrics ... http://127.0.0.1:$((9090 + workers))/metrics
  RabbitMQ   http://127.0.0.1:15672 (guest/guest)
  logs       $log_dir
try:  cargo run -p skilleval-cli -- submit examples/skills/slugify --server http://127.0.0.1:$port --wait
Ctrl-C stops everything.
INFO

# Exit (and stop the rest) as soon as any process dies.
wait -n "${pids[@]}" || true
echo "a process exited; see $log_dir"

#!/usr/bin/env bash
# Starts a local skilleval cluster to try the system: installs what the workers need, builds
# the binaries (release), creates and migrates the database, then runs one coordinator and N
# workers as local processes, logs in a folder. It says "ready" only once the coordinator and
# every worker answered /readyz; otherwise it names what did not, shows its log and stops.
# Ctrl-C stops them all (workers get SIGTERM and finish their in-flight jobs first).
#
#   deploy/local/run-cluster.sh [-n WORKERS] [-p PORT] [-l LOG_DIR] [--brokers 1|3] [--debug]
#
# --brokers 3 runs the service on a three-node RabbitMQ cluster of its own
# (deploy/local/rabbitmq-cluster.sh, AMQP on 127.0.0.1:5681-5683) instead of the machine's
# node: every process gets the three addresses and every queue is a quorum queue on all three
# nodes; the cluster is stopped and removed with the rest.
# Ports: the coordinator's is PORT (default 8080; when the default is taken the next free one
# is used, an explicit -p that is taken is an error); workers get the free ports after it.
# Needs PostgreSQL and RabbitMQ (deploy/local/ensure-services.sh starts them, and this script
# calls it). Uses the database `skilleval` on 127.0.0.1 unless DATABASE_URL is set.
set -euo pipefail
cd "$(dirname "$0")/../.."

# shellcheck source=lib.sh
. deploy/local/lib.sh

workers=2
brokers=1
port=
log_dir=${TMPDIR:-/tmp}/skilleval-cluster
profile=release
while [ $# -gt 0 ]; do
    case $1 in
        -n|--workers) workers=$2; shift 2 ;;
        -p|--port) port=$2; shift 2 ;;
        -l|--logs) log_dir=$2; shift 2 ;;
        --brokers) brokers=$2; shift 2 ;;
        --debug) profile=debug; shift ;;
        -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
        *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
done

if ! command -v cargo >/dev/null 2>&1; then
    echo "error: cargo is not installed: install Rust from https://rustup.rs and run this again" >&2
    exit 2
fi
# The build needs a C toolchain (the linker, mimalloc's C code); the workers run the skills'
# scripts and custom graders under bubblewrap, with python3 and node.
need=()
command -v cc >/dev/null 2>&1 || need+=(build-essential)
command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
command -v bwrap >/dev/null 2>&1 || need+=(bubblewrap)
command -v python3 >/dev/null 2>&1 || need+=(python3)
command -v node >/dev/null 2>&1 || need+=(nodejs)
command -v npm >/dev/null 2>&1 || need+=(npm)
if [ "${#need[@]}" -gt 0 ]; then
    log "installing ${need[*]} (the build's C toolchain, what the workers run skills with)"
    apt_install "${need[@]}"
fi
# The coordinator converts expected.zodSchema with the pinned Zod of tools/zod.
log "the Zod converter: npm ci in tools/zod"
(cd tools/zod && npm ci --no-audit --no-fund --loglevel=error)

case $brokers in
    1|3) ;;
    *) echo "error: --brokers takes 1 (the machine's RabbitMQ) or 3 (a cluster of its own)" >&2; exit 2 ;;
esac

deploy/local/ensure-services.sh

# Whether something listens on 127.0.0.1:$1.
port_taken() { (: <"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# The first free port from $1 up, skipping those in the remaining arguments.
free_port_from() {
    local p=$1
    shift
    while port_taken "$p" || [[ " $* " == *" $p "* ]]; do p=$((p + 1)); done
    echo "$p"
}

if [ -n "$port" ]; then
    if port_taken "$port"; then
        echo "error: port $port (-p) is taken; choose another or stop what listens there" >&2
        exit 2
    fi
else
    port=$(free_port_from 8080)
    [ "$port" = 8080 ] || log "port 8080 is taken: the coordinator listens on $port"
fi
worker_ports=()
next=$((port + 1))
for _ in $(seq 1 "$workers"); do
    p=$(free_port_from "$next" "$port" "${worker_ports[@]}")
    worker_ports+=("$p")
    next=$((p + 1))
done

# A GET of http://127.0.0.1:$1$2 answering 200 (bash only: no curl needed).
http_ok() {
    local status
    { exec 3<>"/dev/tcp/127.0.0.1/$1"; } 2>/dev/null || return 1
    printf 'GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' "$2" >&3
    read -r -t 2 _ status _ <&3 || status=
    exec 3<&- 3>&-
    [ "$status" = 200 ]
}

export DATABASE_URL=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/skilleval}
broker_dir=${TMPDIR:-/tmp}/skilleval-rabbitmq-cluster
export AMQP_URL=${AMQP_URL:-amqp://guest:guest@127.0.0.1:5672/%2f}
export RUST_LOG=${RUST_LOG:-info}
export SKILLEVAL__COORDINATOR__BIND=127.0.0.1:$port
export SKILLEVAL__COORDINATOR__PUBLIC_URL=http://127.0.0.1:$port
export SKILLEVAL_LOG_FORMAT=${SKILLEVAL_LOG_FORMAT:-text}
export SKILLEVAL__COORDINATOR__WEBHOOK_SECRET=${SKILLEVAL__COORDINATOR__WEBHOOK_SECRET:-local-dev-secret}

log "building ($profile)"
cargo_flags=(--locked)
[ "$profile" = release ] && cargo_flags+=(--release)
cargo build "${cargo_flags[@]}" -p skilleval-coordinator -p skilleval-worker -p skilleval-cli
bin=${CARGO_TARGET_DIR:-target}/$profile

mkdir -p "$log_dir"
log "creating the database if missing, applying migrations"
"$bin/skilleval-coordinator" migrate --create-database

pids=()
stop_all() {
    trap - INT TERM EXIT
    echo
    echo "stopping ${#pids[@]} processes (workers finish their in-flight jobs)"
    for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    if [ "${own_cluster:-0}" = 1 ]; then deploy/local/rabbitmq-cluster.sh stop -d "$broker_dir"; fi
    echo "stopped; logs are in $log_dir"
}
trap 'stop_all; exit 130' INT TERM
trap stop_all EXIT

own_cluster=0
if [ "$brokers" = 3 ]; then
    if [ -e "$broker_dir" ]; then
        echo "error: $broker_dir exists: another cluster may run (deploy/local/rabbitmq-cluster.sh stop -d $broker_dir)" >&2
        exit 2
    fi
    own_cluster=1
    deploy/local/rabbitmq-cluster.sh start -d "$broker_dir"
    AMQP_URL=$(cat "$broker_dir/amqp_url")
    export AMQP_URL SKILLEVAL__AMQP__REPLICATED_QUEUES=true
    # The cluster's consumer_timeout (lib.sh): the workers check their claims against it.
    export SKILLEVAL__WORKER__BROKER_CONSUMER_TIMEOUT_MS=$CONSUMER_TIMEOUT_MS
fi

"$bin/skilleval-coordinator" serve >"$log_dir/coordinator.log" 2>&1 &
pids+=($!)
names=(coordinator)
ready_ports=("$port")
logs=("$log_dir/coordinator.log")
for i in $(seq 1 "$workers"); do
    wport=${worker_ports[$((i - 1))]}
    SKILLEVAL__WORKER__HTTP_PORT=$wport "$bin/skilleval-worker" >"$log_dir/worker-$i.log" 2>&1 &
    pids+=($!)
    names+=("worker $i")
    ready_ports+=("$wport")
    logs+=("$log_dir/worker-$i.log")
done

# Every process must answer /readyz within 60 s, and stay alive meanwhile.
deadline=$((SECONDS + 60))
for i in "${!names[@]}"; do
    until http_ok "${ready_ports[$i]}" /readyz; do
        if ! kill -0 "${pids[$i]}" 2>/dev/null || [ "$SECONDS" -ge "$deadline" ]; then
            if kill -0 "${pids[$i]}" 2>/dev/null; then
                echo "error: ${names[$i]} did not become ready within 60 s (http://127.0.0.1:${ready_ports[$i]}/readyz); its log:" >&2
            else
                echo "error: ${names[$i]} exited before becoming ready; its log:" >&2
            fi
            # The error lines first (a backtrace can push them out of the tail), then the tail.
            grep -E 'Error|ERROR|error:|Caused by' "${logs[$i]}" | head -n 10 >&2 || true
            echo "  ..." >&2
            tail -n 10 "${logs[$i]}" >&2
            exit 1
        fi
        sleep 0.5
    done
done

worker_urls=""
for wport in "${worker_ports[@]}"; do worker_urls+=" http://127.0.0.1:$wport/metrics"; done
cat <<INFO
skilleval is ready: 1 coordinator and $workers worker(s) answered /readyz
  API        http://127.0.0.1:$port/v1   (OpenAPI: http://127.0.0.1:$port/v1/openapi.json)
  health     http://127.0.0.1:$port/readyz   metrics: http://127.0.0.1:$port/metrics
  workers   $worker_urls
  RabbitMQ   $(if [ "$brokers" = 3 ]; then echo "$AMQP_URL (deploy/local/rabbitmq-cluster.sh check|kill N|restart N -d $broker_dir)"; else echo "http://127.0.0.1:15672 (guest/guest)"; fi)
  logs       $log_dir
try, in another terminal:
  $bin/skilleval submit examples/skills/calculator --server http://127.0.0.1:$port --wait
Ctrl-C stops everything.
INFO

# Exit (and stop the rest) as soon as any process dies.
wait -n "${pids[@]}" || true
echo "a process exited; see $log_dir"

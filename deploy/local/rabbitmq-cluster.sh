#!/usr/bin/env bash
# A three-node RabbitMQ cluster on this machine's loopback, of Debian's rabbitmq-server, beside
# the machine's own node (which it never touches): each node has its own name, AMQP and
# distribution ports and data folder, and the three share an Erlang cookie of their own.
#
#   deploy/local/rabbitmq-cluster.sh start   [-d DIR] [-p FIRST_PORT] [-n NODES]
#   deploy/local/rabbitmq-cluster.sh check   [-d DIR] [-x PREFIX]
#   deploy/local/rabbitmq-cluster.sh kill N | restart N | stop-app N | start-app N [-d DIR]
#   deploy/local/rabbitmq-cluster.sh stop    [-d DIR]
#
# start: starts the nodes (AMQP on FIRST_PORT, FIRST_PORT+1, ...; default 5681), joins them
#   into one cluster, and prints the AMQP_URL that lists them (also written to DIR/amqp_url).
#   Run the service with that AMQP_URL and SKILLEVAL__AMQP__REPLICATED_QUEUES=true: every queue
#   is then a quorum queue, and a quorum queue's members are the cluster's nodes when it is
#   declared, so each has three. (RabbitMQ takes a queue's type and member count only from the
#   client that declares it, never from a policy: clustering before the service starts and the
#   setting are what make them hold; `check` verifies it.)
# check: every queue of PREFIX (default skilleval) is a quorum queue whose members are all the
#   nodes; exits 1 naming any that is not.
# kill N: SIGKILL node N's Erlang VM (a crash); restart N starts it again on its data.
# stop-app N / start-app N: rabbitmqctl stop_app / start_app on node N (a graceful stop).
# stop: stops every node and removes DIR.
#
# DIR defaults to ${TMPDIR:-/tmp}/skilleval-rabbitmq-cluster. Run as root, the nodes run as the
# `rabbitmq` user (as Debian's service does).
set -euo pipefail

# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"

cmd=${1:-}
[ $# -gt 0 ] && shift
dir=${TMPDIR:-/tmp}/skilleval-rabbitmq-cluster
first_port=5681
nodes=3
prefix=skilleval
target=
while [ $# -gt 0 ]; do
    case $1 in
        -d|--dir) dir=$2; shift 2 ;;
        -p|--port) first_port=$2; shift 2 ;;
        -n|--nodes) nodes=$2; shift 2 ;;
        -x|--prefix) prefix=$2; shift 2 ;;
        [0-9]*) target=$1; shift ;;
        *) echo "unknown argument: $1 (see the head of $0)" >&2; exit 2 ;;
    esac
done

bin=/usr/lib/rabbitmq/bin
if [ ! -x "$bin/rabbitmq-server" ]; then
    log "installing rabbitmq-server"
    apt_install rabbitmq-server
fi

# Runs "$@" as the nodes' user.
as_node_user() {
    if [ "$(id -u)" -eq 0 ]; then
        setpriv --reuid="$(id -u rabbitmq)" --regid="$(id -g rabbitmq)" --init-groups "$@"
    else
        "$@"
    fi
}

node_name() { echo "skilleval-$1@localhost"; }
node_dir() { echo "$dir/node$1"; }
amqp_port() { echo $((first_port + $1 - 1)); }
dist_port() { echo $((first_port + 20000 + $1 - 1)); }

# The variables every command of node $1 runs with.
node_env() {
    local i=$1 base
    base=$(node_dir "$i")
    echo "RABBITMQ_NODENAME=$(node_name "$i")"
    echo "RABBITMQ_CONF_ENV_FILE=$base/rabbitmq-env.conf"
    echo "HOME=$dir/home"
}

ctl() {
    local i=$1
    shift
    # shellcheck disable=SC2046
    as_node_user env $(node_env "$i") "$bin/rabbitmqctl" -n "$(node_name "$i")" "$@"
}

spawn_node() {
    local i=$1 base
    base=$(node_dir "$i")
    # shellcheck disable=SC2046
    as_node_user env $(node_env "$i") \
        RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 \
        RABBITMQ_NODE_PORT="$(amqp_port "$i")" \
        RABBITMQ_DIST_PORT="$(dist_port "$i")" \
        RABBITMQ_CONFIG_FILE="$base/rabbitmq.conf" \
        RABBITMQ_ADVANCED_CONFIG_FILE="$base/advanced.config" \
        RABBITMQ_ENABLED_PLUGINS_FILE="$base/enabled_plugins" \
        RABBITMQ_MNESIA_BASE="$base/mnesia" \
        RABBITMQ_PID_FILE="$base/node.pid" \
        RABBITMQ_LOG_BASE="$base/log" \
        RABBITMQ_LOGS=- \
        setsid "$bin/rabbitmq-server" </dev/null >>"$base/server.log" 2>&1 &
}

await_node() {
    local i=$1 waited=0
    # The AMQP listener opens late in the boot; await_startup needs the node registered.
    until (: <"/dev/tcp/127.0.0.1/$(amqp_port "$i")") 2>/dev/null; do
        if [ "$waited" -ge 180 ]; then
            echo "error: node $i does not listen on $(amqp_port "$i") after 180 s; the end of its log:" >&2
            tail -n 30 "$(node_dir "$i")/server.log" >&2
            exit 1
        fi
        sleep 1
        waited=$((waited + 1))
    done
    if ! ctl "$i" await_startup --timeout 180 >/dev/null; then
        echo "error: node $i did not start; the end of its log ($(node_dir "$i")/server.log):" >&2
        tail -n 30 "$(node_dir "$i")/server.log" >&2
        exit 1
    fi
}

node_count() { cat "$dir/nodes" 2>/dev/null || echo "$nodes"; }

await_running() {
    local want=$1 waited=0 running
    while :; do
        running=$(ctl 1 eval 'length(rabbit_nodes:all_running()).' 2>/dev/null || echo 0)
        [ "$running" = "$want" ] && return 0
        if [ "$waited" -ge 180 ]; then
            echo "error: the cluster has $running running nodes, not $want" >&2
            exit 1
        fi
        sleep 1
        waited=$((waited + 1))
    done
}

need_target() {
    if [ -z "$target" ] || [ "$target" -lt 1 ] || [ "$target" -gt "$(node_count)" ]; then
        echo "error: name a node, 1..$(node_count)" >&2
        exit 2
    fi
}

case $cmd in
    start)
        if [ -e "$dir" ]; then
            echo "error: $dir exists: a cluster may be running ($0 stop removes it)" >&2
            exit 2
        fi
        for i in $(seq 1 "$nodes"); do
            if (: <"/dev/tcp/127.0.0.1/$(amqp_port "$i")") 2>/dev/null; then
                echo "error: port $(amqp_port "$i") is taken (-p chooses the first port)" >&2
                exit 2
            fi
        done
        mkdir -p "$dir/home"
        echo "$nodes" >"$dir/nodes"
        echo "$first_port" >"$dir/first_port"
        # The cluster's own Erlang cookie: not the system node's.
        head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' | tr 'a-f' 'A-F' >"$dir/home/.erlang.cookie"
        chmod 400 "$dir/home/.erlang.cookie"
        for i in $(seq 1 "$nodes"); do
            base=$(node_dir "$i")
            mkdir -p "$base"
            # consumer_timeout: lib.sh's, what run-cluster.sh's workers are told.
            printf 'listeners.tcp.1 = 127.0.0.1:%s\ncluster_partition_handling = pause_minority\nconsumer_timeout = %s\n' \
                "$(amqp_port "$i")" "$CONSUMER_TIMEOUT_MS" >"$base/rabbitmq.conf"
            # No plugins: the system node's management plugin holds port 15672.
            echo '[].' >"$base/enabled_plugins"
            : >"$base/rabbitmq-env.conf"
        done
        [ "$(id -u)" -eq 0 ] && chown -R rabbitmq:rabbitmq "$dir"
        chmod 755 "$dir"
        log "starting $nodes nodes in $dir"
        for i in $(seq 1 "$nodes"); do spawn_node "$i"; done
        for i in $(seq 1 "$nodes"); do await_node "$i"; done
        log "clustering them"
        for i in $(seq 2 "$nodes"); do
            ctl "$i" stop_app >/dev/null
            ctl "$i" join_cluster "$(node_name 1)" >/dev/null
            ctl "$i" start_app >/dev/null
            await_node "$i"
        done
        await_running "$nodes"
        urls=()
        for i in $(seq 1 "$nodes"); do urls+=("amqp://guest:guest@127.0.0.1:$(amqp_port "$i")/%2f"); done
        (IFS=,; echo "${urls[*]}") >"$dir/amqp_url"
        log "a cluster of $nodes nodes is up"
        echo "AMQP_URL=$(cat "$dir/amqp_url")"
        echo "SKILLEVAL__AMQP__REPLICATED_QUEUES=true"
        ;;
    check)
        [ -d "$dir" ] || { echo "error: no cluster in $dir" >&2; exit 2; }
        first_port=$(cat "$dir/first_port")
        n=$(node_count)
        bad=0
        seen=0
        while IFS=$'\t' read -r name type members; do
            case $name in "$prefix".*) ;; *) continue ;; esac
            seen=$((seen + 1))
            count=$(echo "$members" | tr -cd ',' | wc -c)
            count=$((count + 1))
            if [ "$type" != quorum ] || [ "$count" -ne "$n" ]; then
                echo "not replicated: $name ($type, members $members)"
                bad=1
            fi
        done < <(ctl 1 list_queues --quiet --no-table-headers name type members)
        if [ "$seen" -eq 0 ]; then
            echo "no queue of the prefix $prefix yet (the service declares them when it starts)" >&2
            exit 1
        fi
        [ "$bad" -eq 0 ] && echo "every one of the $seen $prefix.* queues is a quorum queue on all $n nodes"
        exit "$bad"
        ;;
    kill)
        need_target
        first_port=$(cat "$dir/first_port")
        pid=$(cat "$(node_dir "$target")/node.pid")
        kill -KILL "$pid"
        log "node $target ($(node_name "$target"), pid $pid) killed"
        ;;
    restart)
        need_target
        first_port=$(cat "$dir/first_port")
        spawn_node "$target"
        await_node "$target"
        await_running "$(node_count)"
        log "node $target is back"
        ;;
    stop-app)
        need_target
        first_port=$(cat "$dir/first_port")
        ctl "$target" stop_app >/dev/null
        log "node $target's broker stopped (the VM runs: start-app $target)"
        ;;
    start-app)
        need_target
        first_port=$(cat "$dir/first_port")
        ctl "$target" start_app >/dev/null
        await_running "$(node_count)"
        log "node $target's broker is back"
        ;;
    stop)
        [ -d "$dir" ] || exit 0
        first_port=$(cat "$dir/first_port" 2>/dev/null || echo "$first_port")
        for i in $(seq "$(node_count)" -1 1); do
            ctl "$i" stop >/dev/null 2>&1 || {
                pid=$(cat "$(node_dir "$i")/node.pid" 2>/dev/null || true)
                [ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null || true
            }
        done
        rm -rf "$dir"
        log "the cluster is stopped and $dir removed"
        ;;
    *)
        sed -n '2,24p' "$0"
        exit 2
        ;;
esac

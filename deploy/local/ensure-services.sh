#!/usr/bin/env bash
# Ensures PostgreSQL and RabbitMQ are installed and running on this machine, for local runs and
# the integration tests. Idempotent: installs from Debian's packages only what is missing,
# starts only what is stopped, and returns once both answer. Assumes no systemd (containers,
# CI machines): it starts the daemons directly.
#
# Afterwards: PostgreSQL on 127.0.0.1:5432 with trust auth for local connections (user
# postgres), RabbitMQ on 127.0.0.1:5672 (guest/guest) with the management plugin on :15672.
set -euo pipefail

# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"

# Waits until "$@" succeeds, for at most $timeout seconds.
wait_for() {
    local what=$1 timeout=$2
    shift 2
    local waited=0
    until "$@" >/dev/null 2>&1; do
        if [ "$waited" -ge "$timeout" ]; then
            echo "error: $what did not come up within ${timeout}s" >&2
            return 1
        fi
        sleep 1
        waited=$((waited + 1))
    done
}

# --- PostgreSQL -------------------------------------------------------------------------------
if ! command -v pg_ctlcluster >/dev/null 2>&1 || [ -z "$(ls /etc/postgresql 2>/dev/null)" ]; then
    log "installing postgresql"
    apt_install postgresql
fi
pg_version=$(ls /etc/postgresql | sort -V | tail -n1)
if ! pg_isready -h 127.0.0.1 -p 5432 -q; then
    # Trust local TCP connections, as the tests and the local cluster expect (development only).
    hba="/etc/postgresql/$pg_version/main/pg_hba.conf"
    if [ -f "$hba" ] && ! grep -qE '^host\s+all\s+all\s+127\.0\.0\.1/32\s+trust' "$hba"; then
        log "trusting local TCP connections in $hba"
        as_root sed -i '1i host all all 127.0.0.1/32 trust\nhost all all ::1/128 trust' "$hba"
    fi
    log "starting PostgreSQL $pg_version"
    as_root pg_ctlcluster --skip-systemctl-redirect "$pg_version" main start || true
fi
wait_for "PostgreSQL" 60 pg_isready -h 127.0.0.1 -p 5432 -q
if ! psql -h 127.0.0.1 -U postgres -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = 'test'" 2>/dev/null | grep -q 1; then
    psql -h 127.0.0.1 -U postgres -d postgres -qc "CREATE DATABASE test" >/dev/null 2>&1 || true
fi

# --- RabbitMQ ---------------------------------------------------------------------------------
if ! command -v rabbitmq-server >/dev/null 2>&1; then
    log "installing rabbitmq-server"
    apt_install rabbitmq-server
fi
if ! rabbitmq-diagnostics -q ping >/dev/null 2>&1; then
    log "starting RabbitMQ"
    as_root rabbitmq-server -detached >/dev/null 2>&1 || true
    wait_for "RabbitMQ" 120 rabbitmq-diagnostics -q ping
fi
# The management API (used by KEDA-style queue-length checks and by people) is optional here.
if ! rabbitmq-plugins list -e -m 2>/dev/null | grep -qx rabbitmq_management; then
    as_root rabbitmq-plugins enable --quiet rabbitmq_management >/dev/null 2>&1 || true
fi

log "PostgreSQL and RabbitMQ are up (postgres://postgres@127.0.0.1:5432, amqp://guest:guest@127.0.0.1:5672)"

#!/usr/bin/env bash
# Runs schemathesis against a real coordinator, from the coordinator's own /v1/openapi.json:
# no 5xx and no response that violates the document (docs/security.md lists the checks).
#
# Creates a fresh database and RabbitMQ vhost, starts the built skilleval-coordinator on
# 127.0.0.1:0 with a bearer token (port read from its log) and a worker, uploads an example
# skill and waits for its run, runs schemathesis with the token (half of the generated ids
# replaced by the seeded ones: scripts/schemathesis_hooks.py), and removes the coordinator, the database and the vhost afterwards. schemathesis is
# installed in a virtualenv under /var/tmp on the first run.
#
#   scripts/schemathesis.sh [BIN_DIR]     (default: ${CARGO_TARGET_DIR:-target}/debug)
#   SCHEMATHESIS_MAX_EXAMPLES (default 25) examples per operation and phase,
#   SCHEMATHESIS_MAX_SECONDS (default 180) for the whole run,
#   SCHEMATHESIS_SEED (default 20261127) the generation's seed (fixed, so CI is repeatable;
#   another one explores other inputs).
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=../deploy/local/lib.sh
. deploy/local/lib.sh

bin_dir=${1:-${CARGO_TARGET_DIR:-target}/debug}
max_examples=${SCHEMATHESIS_MAX_EXAMPLES:-25}
max_seconds=${SCHEMATHESIS_MAX_SECONDS:-180}
st_seed=${SCHEMATHESIS_SEED:-20261127}
venv=${SCHEMATHESIS_VENV:-/var/tmp/skilleval-schemathesis}
st_version='schemathesis>=4.32,<5'

if [ ! -x "$venv/bin/schemathesis" ]; then
    log "installing schemathesis into $venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet "$st_version"
fi

pg=${SKILLEVAL_TEST_PG:-postgres://postgres@127.0.0.1:5432}
id=$(python3 -c 'import uuid; print(uuid.uuid4().hex[:12])')
db="skilleval_schemathesis_$id"
vhost="schemathesis-$id"
token="st-$(python3 -c 'import secrets; print(secrets.token_hex(16))')"
work=$(mktemp -d)
coordinator_pid=
worker_pid=

cleanup() {
    if [ -n "$worker_pid" ]; then
        kill "$worker_pid" 2>/dev/null || true
        wait "$worker_pid" 2>/dev/null || true
    fi
    if [ -n "$coordinator_pid" ]; then
        kill "$coordinator_pid" 2>/dev/null || true
        wait "$coordinator_pid" 2>/dev/null || true
    fi
    psql -q "$pg/postgres" -c "DROP DATABASE IF EXISTS \"$db\" WITH (FORCE)" >/dev/null 2>&1 || true
    as_root rabbitmqctl -q delete_vhost "$vhost" >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT

as_root rabbitmqctl -q add_vhost "$vhost" >/dev/null
as_root rabbitmqctl -q set_permissions -p "$vhost" guest '.*' '.*' '.*' >/dev/null

export DATABASE_URL="$pg/$db"
export AMQP_URL="amqp://guest:guest@127.0.0.1:5672/$vhost"
export SKILLEVAL__COORDINATOR__BIND=127.0.0.1:0
export SKILLEVAL__COORDINATOR__AUTH_TOKENS="$token"
export SKILLEVAL_LOG_FORMAT=json
export RUST_LOG=info,sqlx=warn,lapin=warn
"$bin_dir/skilleval-coordinator" migrate --create-database >"$work/migrate.log" 2>&1 || {
    cat "$work/migrate.log" >&2
    exit 1
}
"$bin_dir/skilleval-coordinator" serve >"$work/coordinator.log" 2>&1 &
coordinator_pid=$!

port=
for _ in $(seq 1 100); do
    port=$(grep -o '"message":"coordinator listening"[^}]*' "$work/coordinator.log" 2>/dev/null |
        grep -o '"port":[0-9]*' | head -n1 | cut -d: -f2 || true)
    [ -z "$port" ] && port=$(grep '"coordinator listening"' "$work/coordinator.log" 2>/dev/null |
        grep -o '"port":[0-9]*' | head -n1 | cut -d: -f2 || true)
    [ -n "$port" ] && break
    if ! kill -0 "$coordinator_pid" 2>/dev/null; then break; fi
    sleep 0.2
done
if [ -z "$port" ]; then
    echo "the coordinator did not start:" >&2
    tail -n 40 "$work/coordinator.log" >&2
    exit 1
fi
base="http://127.0.0.1:$port"

# Seed an example skill and let a worker run it, so that half of the generated ids name
# objects that exist (scripts/schemathesis_hooks.py).
SKILLEVAL__WORKER__HTTP_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])') \
    "$bin_dir/skilleval-worker" >"$work/worker.log" 2>&1 &
worker_pid=$!
seed=examples/skills/calculator
python3 - "$seed" "$work/seed.zip" <<'PY'
import os, sys, zipfile
root, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
    for folder, _, files in os.walk(root):
        for f in files:
            path = os.path.join(folder, f)
            z.write(path, os.path.relpath(path, root))
PY
upload=$(curl -sS -X POST -H "Authorization: Bearer $token" -H 'Content-Type: application/zip' \
    --data-binary "@$work/seed.zip" "$base/v1/skills")
export ST_SKILL ST_RUN
ST_SKILL=$(python3 -c 'import json, sys; print(json.loads(sys.argv[1])["name"])' "$upload")
ST_RUN=$(python3 -c 'import json, sys; print(json.loads(sys.argv[1])["run_id"])' "$upload")
for _ in $(seq 1 600); do
    status=$(curl -sS -H "Authorization: Bearer $token" "$base/v1/runs/$ST_RUN" |
        python3 -c 'import json, sys; print(json.load(sys.stdin)["status"])')
    [ "$status" = completed ] && break
    kill -0 "$worker_pid" 2>/dev/null || { grep -v '^ ' "$work/worker.log" | tail -n 20 >&2; break; }
    sleep 0.2
done
log "seeded skill $ST_SKILL, run $ST_RUN ($status)"
log "schemathesis against $base/v1/openapi.json (at most $max_examples examples per operation, ${max_seconds}s)"

status=0
# One worker: with two, Hypothesis (describing its strategies) failed inside CPython 3.11's
# ast.parse, which is not safe across threads ("AST constructor recursion depth mismatch").
# Run from the scratch folder: schemathesis keeps a cache of crashes in its working folder.
hooks_dir="$PWD/scripts"
cd "$work"
PYTHONPATH="$hooks_dir${PYTHONPATH:+:$PYTHONPATH}" SCHEMATHESIS_HOOKS=schemathesis_hooks \
    "$venv/bin/schemathesis" run "$base/v1/openapi.json" \
    --url "$base" \
    --header "Authorization: Bearer $token" \
    --checks not_a_server_error,status_code_conformance,content_type_conformance,response_headers_conformance,response_schema_conformance \
    --phases examples,coverage,fuzzing \
    --max-examples "$max_examples" \
    --max-time "$max_seconds" \
    --workers 1 \
    --request-timeout 30 \
    --seed "$st_seed" \
    --generation-database none \
    --no-color \
    --suppress-health-check all || status=$?
if [ "$status" -ne 0 ]; then
    echo "schemathesis found failures; the coordinator's log ends with:" >&2
    grep -E '"level":"(ERROR|WARN)"' "$work/coordinator.log" | tail -n 20 >&2 || true
fi
exit "$status"

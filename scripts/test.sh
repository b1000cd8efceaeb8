#!/usr/bin/env bash
# The project's test command (README): sets up what the tests need, then checks formatting,
# lints and runs every test.
#
# On a fresh Debian machine it installs what is missing (bubblewrap, python3, node, promtool,
# and PostgreSQL and RabbitMQ through deploy/local/ensure-services.sh) and starts the services that
# are stopped. Run as root, or with sudo available, the first time.
set -euo pipefail

cd "$(dirname "$0")/.."

# shellcheck source=../deploy/local/lib.sh
. deploy/local/lib.sh

# Tools the sandboxed runners and graders need: bubblewrap (the sandbox), python3 and node
# (custom graders and example skills), prlimit and setpriv (util-linux, always on Debian).
need=()
command -v bwrap >/dev/null 2>&1 || need+=(bubblewrap)
command -v python3 >/dev/null 2>&1 || need+=(python3)
command -v node >/dev/null 2>&1 || need+=(nodejs)
# pip installs uv (below) when it is missing.
command -v uv >/dev/null 2>&1 || python3 -m pip --version >/dev/null 2>&1 || need+=(python3-pip)
# npm installs the Zod converter (tools/zod) that expected.zodSchema is converted with.
command -v npm >/dev/null 2>&1 || need+=(npm)
command -v prlimit >/dev/null 2>&1 || need+=(util-linux)
command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
# promtool checks and unit-tests the alert rules in deploy/monitoring (Debian's `prometheus`).
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
# The web interface's browser tests drive Debian's headless Chromium through chromedriver.
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need+=(chromium-driver)
if [ "${#need[@]}" -gt 0 ]; then
    log "installing ${need[*]}"
    apt_install "${need[@]}"
fi

# uv builds the environments of skills that declare Python dependencies (the environment
# tests, crates/execution/tests/environments); pip's `uv` package ships its binary.
if ! command -v uv >/dev/null 2>&1; then
    log "installing uv (python3 -m pip install uv)"
    python3 -m pip install --quiet uv 2>/dev/null || python3 -m pip install --quiet --break-system-packages uv
fi

log "the Zod converter: npm ci in tools/zod (the versions its package-lock.json pins)"
(cd tools/zod && npm ci --no-audit --no-fund --loglevel=error)

if [ -x deploy/local/ensure-services.sh ]; then
    log "ensuring PostgreSQL and RabbitMQ are running"
    deploy/local/ensure-services.sh
fi

if ! command -v cargo >/dev/null 2>&1; then
    echo "cargo is not installed: install Rust from https://rustup.rs and run this again" >&2
    exit 2
fi

log "cargo fmt --check"
cargo fmt --all -- --check

log "no module imports one that imports it back (docs/architecture.md), and the check finds planted loops"
python3 scripts/module_cycles.py --self-test
python3 scripts/module_cycles.py

log "cargo clippy --all-targets -- -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings

log "promtool: alert rules in deploy/monitoring"
promtool check rules deploy/monitoring/alerts.yaml
(cd deploy/monitoring && promtool test rules alerts.test.yaml)

log "cargo test (the monitoring tests also check every metric the dashboard and rules name is exported)"
cargo test --workspace --locked --no-fail-fast -- "$@"

log "every example validates and runs"
# Offline: the agent examples (sales-report, expense-workbook) need a model provider, so
# without one their cases are recorded skipped and expense-workbook's environment (openpyxl)
# is never built; `validate` still checks its PEP 723 block.
cargo build --workspace --locked --bins  # same feature set as the tests: no rebuild
bin="${CARGO_TARGET_DIR:-target}/debug/skilleval"
for skill in examples/skills/*/; do
    "$bin" validate "$skill"
    "$bin" run --quiet --no-write "$skill"
done

log "the example production log is graded offline"
"$bin" monitor --quiet examples/sampling/samples.jsonl examples/skills/refund-triage >/dev/null

log "cargo fuzz: every target of fuzz/ for ${FUZZ_SECONDS:-60}s (docs/security.md)"
scripts/fuzz.sh

log "schemathesis: a coordinator against its own OpenAPI document (docs/security.md)"
scripts/schemathesis.sh "${CARGO_TARGET_DIR:-target}/debug"

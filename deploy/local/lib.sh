# Shell helpers shared by the set-up scripts (sourced, not run): logging, running as root, and
# installing Debian packages with one `apt-get update` per script run.

# Bold on a terminal, plain text in a log file or a CI log; each line says how long the script
# has run (bash's SECONDS), so a slow step shows in the log.
log() {
    local at
    at=$(printf '%d:%02d' $((SECONDS / 60)) $((SECONDS % 60)))
    if [ -t 2 ]; then printf '\033[1m==> [%s] %s\033[0m\n' "$at" "$*" >&2; else printf '==> [%s] %s\n' "$at" "$*" >&2; fi
}

# The brokers' consumer acknowledgement timeout (ms) for the clusters these scripts start, and
# what their workers are told (worker.broker_consumer_timeout_ms): 2 h, twice the longest case
# they expect, 1 h (docs/operations.md, "Consumer acknowledgement timeout").
# shellcheck disable=SC2034  # used by the scripts that source this file
CONSUMER_TIMEOUT_MS=7200000

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

apt_updated=0
apt_install() {
    if [ "$apt_updated" -eq 0 ]; then
        as_root apt-get update -qq
        apt_updated=1
    fi
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "$@" >/dev/null
}

# syntax=docker/dockerfile:1.7
# The worker image: consumes jobs, produces and grades outputs, writes results.
# Untrusted code (custom graders, `command` runners) runs under bubblewrap, with python3 and
# node for `.py` and `.js` scripts. bubblewrap needs unprivileged user namespaces: run the
# container with a seccomp profile that allows them (compose.yaml and the k8s manifest say how).
#
# Build from the repository root:
#   docker build -f deploy/docker/worker.Dockerfile -t skilleval-worker .

FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p skilleval-worker \
    && install -D target/release/skilleval-worker /out/skilleval-worker

FROM debian:bookworm-slim AS runtime
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl bubblewrap python3 nodejs util-linux \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --home-dir /app skilleval \
    && mkdir -p /var/cache/skilleval && chown skilleval /var/cache/skilleval
WORKDIR /app
COPY --from=build /out/skilleval-worker /usr/local/bin/skilleval-worker
# config/default.toml, then config/production.toml (SKILLEVAL_ENV): the package cache
# folder, JSON logs, the shutdown grace. Variables override them.
COPY config /app/config
USER skilleval
ENV SKILLEVAL_ENV=production \
    RUST_LOG=info
EXPOSE 8081
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
    CMD curl -fsS http://127.0.0.1:8081/healthz || exit 1
# SIGTERM: stop consuming, finish in-flight jobs within the grace period, exit 0.
STOPSIGNAL SIGTERM
ENTRYPOINT ["skilleval-worker"]

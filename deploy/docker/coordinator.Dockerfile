# syntax=docker/dockerfile:1.7
# The coordinator image: HTTP API, run creation and publishing, aggregation, webhooks.
# Also runs the schema migrations (`skilleval-coordinator migrate`), so the compose file and the
# Kubernetes migrate Job use this image too. Uploads with `expected.zodSchema` are converted to
# JSON Schema by the pinned Zod of tools/zod (installed here with `npm ci` from its
# package-lock.json) under bubblewrap with node: like the worker, run the container with a
# seccomp profile that allows user namespaces (compose.yaml and the k8s manifest say how).
#
# Build from the repository root:
#   docker build -f deploy/docker/coordinator.Dockerfile -t skilleval-coordinator .

FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
# Cache mounts keep the registry and the target dir between builds (BuildKit).
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p skilleval-coordinator \
    && install -D target/release/skilleval-coordinator /out/skilleval-coordinator

# The Zod converter: exactly the versions package-lock.json pins.
FROM debian:bookworm-slim AS zod
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates nodejs npm \
    && rm -rf /var/lib/apt/lists/*
COPY tools/zod /zod
RUN cd /zod && npm ci --no-audit --no-fund

FROM debian:bookworm-slim AS runtime
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl bubblewrap nodejs util-linux \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --home-dir /app skilleval
WORKDIR /app
COPY --from=build /out/skilleval-coordinator /usr/local/bin/skilleval-coordinator
# coordinator.zod_dir is tools/zod, from the working directory.
COPY --from=zod /zod /app/tools/zod
# config/default.toml, then config/production.toml (SKILLEVAL_ENV): the bind address, JSON
# logs. Variables override them.
COPY config /app/config
USER skilleval
ENV SKILLEVAL_ENV=production \
    RUST_LOG=info
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
    CMD curl -fsS http://127.0.0.1:8080/healthz || exit 1
ENTRYPOINT ["skilleval-coordinator"]
CMD ["serve"]

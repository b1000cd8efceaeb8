# syntax=docker/dockerfile:1.7
# The coordinator image: HTTP API, run creation and publishing, aggregation, webhooks.
# Also runs the schema migrations (`skilleval-coordinator migrate`), so the compose file and the
# Kubernetes migrate Job use this image too.
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

FROM debian:bookworm-slim AS runtime
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --home-dir /app skilleval
WORKDIR /app
COPY --from=build /out/skilleval-coordinator /usr/local/bin/skilleval-coordinator
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

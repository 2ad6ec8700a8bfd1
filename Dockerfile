# syntax=docker/dockerfile:1
#
# outbox-relay: one image for `serve` (the order API) and `relay` (the sidecar).
#   docker build -t outbox-relay .
#   docker run --rm -e DATABASE_URL=... outbox-relay relay
# docker-compose.yml builds and runs it next to PostgreSQL, Mailpit and a webhook receiver.

# ---- build ------------------------------------------------------------------
# Same Debian release as the runtime stage, so the binary links the libpq5 it finds there.
FROM rust:1.95-slim-bookworm AS builder
RUN apt-get update \
 && apt-get install -y --no-install-recommends libpq-dev pkg-config \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# The cache mounts keep the registry and compiled dependencies between builds;
# the binary is copied out because the target directory is not part of the image.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin outbox-relay \
 && cp target/release/outbox-relay /usr/local/bin/outbox-relay

# ---- runtime ----------------------------------------------------------------
# Templates, DejaVu Sans and migrations are compiled into the binary: it needs
# libpq (Diesel), CA certificates (smtps:// and https:// webhooks) and Noto Sans
# CJK for Chinese, Japanese and Korean on receipts (RECEIPT_FONT_PATH's default).
# Only NotoSansCJK-Regular.ttc is read: the serif and bold files (~70 MB) go.
FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends libpq5 ca-certificates fonts-noto-cjk \
 && rm -rf /var/lib/apt/lists/* \
 && rm -f /usr/share/fonts/opentype/noto/NotoSerifCJK-*.ttc /usr/share/fonts/opentype/noto/NotoSansCJK-Bold.ttc \
 && useradd --system --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin outbox
COPY --from=builder /usr/local/bin/outbox-relay /usr/local/bin/outbox-relay
USER 10001:10001
# Inside a container the listeners must not be loopback-only.
ENV API_ADDR=0.0.0.0:8080 \
    METRICS_ADDR=0.0.0.0:9187
# 8080: the order API (serve); 9187: /metrics and /healthz (relay).
EXPOSE 8080 9187
ENTRYPOINT ["outbox-relay"]
CMD ["serve"]

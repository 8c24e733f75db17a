# Build stage: the release binary, with the lock file as checked in, on the
# toolchain Cargo.toml's rust-version names (keep the two equal).
FROM rust:1.94-bookworm AS builder
WORKDIR /src
COPY . .
RUN cargo build --release --locked

# Runtime stage: the binary, CA certificates and curl for the healthcheck.
FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --home-dir /data --shell /usr/sbin/nologin ledger \
    && mkdir -p /data \
    && chown ledger:ledger /data
COPY --from=builder /src/target/release/child-ledger /usr/local/bin/child-ledger
# On 0.0.0.0 the service refuses to start without a tokens file
# (LEDGER_TOKENS_FILE) unless LEDGER_ALLOW_ANONYMOUS=true: see README,
# "Access control".
ENV LEDGER_LISTEN=0.0.0.0:8080 \
    DATABASE_URL=sqlite:///data/child-ledger.db
VOLUME /data
WORKDIR /data
USER ledger
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD curl -fsS http://localhost:8080/readyz || exit 1
ENTRYPOINT ["/usr/local/bin/child-ledger"]

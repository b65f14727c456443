# syntax=docker/dockerfile:1
#
# fusebox in a container: build with the Rust toolchain, run on a slim
# Debian with only the binary, as an unprivileged user.
#
#   docker build -t fusebox .
#   docker run --rm -e FUSEBOX_TOKEN=... -p 50051:50051 -p 9090:9090 fusebox
#
# The image serves examples/docker.toml: every call needs a token, and the
# admin token is read from FUSEBOX_TOKEN at start-up. docker-compose.yml
# mounts the same file, so that it can be edited without a rebuild.

FROM rust:1-bookworm AS builder
WORKDIR /src
# The proto is compiled by src/proto/build.rs with protox: no system protoc is needed.
COPY Cargo.toml Cargo.lock ./
COPY proto ./proto
COPY src ./src
# Cargo.toml names the benchmark target, so its source must be present too,
# and the workspace's other member (the Redis module, not built here).
COPY benches ./benches
COPY redis ./redis
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked \
    && install -m 0755 target/release/fusebox /usr/local/bin/fusebox

FROM debian:bookworm-slim
RUN useradd --system --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin fusebox
COPY --from=builder /usr/local/bin/fusebox /usr/local/bin/fusebox
COPY examples/docker.toml /etc/fusebox/fusebox.toml
USER fusebox:fusebox
EXPOSE 50051 9090
# Logs go to standard error; FUSEBOX_LOG sets the filter (e.g. "debug").
ENV FUSEBOX_LOG=info
# fusebox stops gracefully on SIGTERM (docker stop): it reports NOT_SERVING,
# answers waiters and finishes in-flight calls.
ENTRYPOINT ["fusebox"]
CMD ["serve", "--config", "/etc/fusebox/fusebox.toml", "--listen", "0.0.0.0:50051", "--http", "0.0.0.0:9090"]

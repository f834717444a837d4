# image: redis-stream-coord-worker:0.1.0
#
# The example worker (`examples`, binary `worker`), as deploy/kubernetes/worker.yaml runs it: a consumer that
# logs its assignments and, every few seconds, its rate, lag and pending entries. Build it from the repository's
# root with scripts/build-images.sh, or by hand:
#   docker build -f deploy/images/worker.Dockerfile -t redis-stream-coord-worker:0.1.0 .
# The image name above is checked against the manifests by tests (examples/tests/images.rs).
#
# Two stages, as for the coordinator: the release build (jemalloc, the examples' default feature, is why the
# builder is the full Rust image with make), then the binary alone on distroless, as the non-root user 65532.
ARG RUST_IMAGE=rust:1.95-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian12:nonroot

FROM ${RUST_IMAGE} AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p examples --bin worker \
    && install -m 0755 target/release/worker /worker

FROM ${RUNTIME_IMAGE}
LABEL org.opencontainers.image.title="redis-stream-coord-worker" \
      org.opencontainers.image.description="Example worker of redis-stream-coord: a consumer-group member" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/redis-stream-coord/redis-stream-coord"
COPY --from=build /worker /usr/local/bin/worker
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/worker"]

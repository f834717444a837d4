# image: redis-stream-coord:0.1.0
#
# The coordinator (`coord-server`), as deploy/kubernetes/coordinator.yaml runs it. Build it from the repository's
# root with scripts/build-images.sh (docker, podman or buildah), or by hand:
#   docker build -f deploy/images/coordinator.Dockerfile -t redis-stream-coord:0.1.0 .
# The image name above is checked against the manifests by tests (examples/tests/images.rs).
#
# Two stages: the release build in the Rust image, then only the binary on a distroless runtime (glibc and
# libgcc, no shell, no package manager; about 25 MB), run as the distroless `nonroot` user 65532, the user the
# manifests ask for. Both base images can be replaced (a mirror, a pinned digest) with --build-arg.
ARG RUST_IMAGE=rust:1.95-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian12:nonroot

FROM ${RUST_IMAGE} AS build
WORKDIR /src
COPY . .
# --locked: the image is built from the dependency versions the repository tested.
RUN cargo build --release --locked -p coord-server --bin coord-server \
    && install -m 0755 target/release/coord-server /coord-server

FROM ${RUNTIME_IMAGE}
LABEL org.opencontainers.image.title="redis-stream-coord" \
      org.opencontainers.image.description="Coordinator of redis-stream-coord consumer groups (coord-server)" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/redis-stream-coord/redis-stream-coord"
COPY --from=build /coord-server /usr/local/bin/coord-server
# Inside a container the coordinator must listen on every interface (the binary's default is loopback).
ENV COORD_LISTEN=0.0.0.0:7400
EXPOSE 7400
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/coord-server"]

#!/usr/bin/env bash
# Builds the container images that deploy/kubernetes runs, from deploy/images/*.Dockerfile (each names its image
# on its `# image: NAME:TAG` line): the coordinator (redis-stream-coord) and the example worker
# (redis-stream-coord-worker).
#
#   scripts/build-images.sh                 with the first of docker, podman, buildah that works here
#   scripts/build-images.sh --tool podman   with that one only
#   scripts/build-images.sh --list          print the images and their Dockerfiles, build nothing
#
# A tool works when it is installed, can reach its engine (docker: the daemon) and can reach both base images
# (present locally, or pulled now). Replace the base images, e.g. with a mirror or a pinned digest:
#   RUST_IMAGE=my-mirror/rust:1.95-bookworm RUNTIME_IMAGE=my-mirror/distroless-cc:nonroot scripts/build-images.sh
# Exit status: 0 built, 1 a build failed, 2 no tool could build here (each tool tried is named with the reason).
set -euo pipefail
cd "$(dirname "$0")/.."

RUST_IMAGE=${RUST_IMAGE:-rust:1.95-bookworm}
RUNTIME_IMAGE=${RUNTIME_IMAGE:-gcr.io/distroless/cc-debian12:nonroot}
say() { echo "build-images: $*" >&2; }

tools=(docker podman buildah)
list=false
while [ $# -gt 0 ]; do
  case "$1" in
    --tool) tools=("${2:?--tool needs docker, podman or buildah}"); shift 2 ;;
    --list) list=true; shift ;;
    *) say "usage: scripts/build-images.sh [--tool docker|podman|buildah] [--list]"; exit 2 ;;
  esac
done

dockerfiles=(deploy/images/*.Dockerfile)
image_of() { sed -n 's/^# image: *//p' "$1" | head -1; }
for f in "${dockerfiles[@]}"; do
  [ -n "$(image_of "$f")" ] || { say "$f has no '# image: NAME:TAG' line"; exit 1; }
done
if $list; then
  for f in "${dockerfiles[@]}"; do echo "$(image_of "$f") $f"; done
  exit 0
fi

# has_image TOOL IMAGE: the image is there or can be pulled now; on failure the reason is in $reason.
reason=""
has_image() {
  local tool=$1 image=$2 out
  case "$tool" in
    docker) docker image inspect "$image" >/dev/null 2>&1 && return 0 ;;
    podman) podman image exists "$image" 2>/dev/null && return 0 ;;
    buildah) buildah inspect --type image "$image" >/dev/null 2>&1 && return 0 ;;
  esac
  say "$tool: pulling $image"
  if out=$(timeout 300 "$tool" pull "$image" 2>&1); then return 0; fi
  reason="cannot pull $image: $(echo "$out" | grep -v '^\s*$' | tail -1)"
  return 1
}

usable() {
  local tool=$1
  if ! command -v "$tool" >/dev/null 2>&1; then
    reason="not installed (Debian: apt-get install $tool)"
    return 1
  fi
  if [ "$tool" = docker ] && ! out=$(docker info 2>&1 >/dev/null); then
    reason="the client is installed but no engine answers ($(echo "$out" | grep -v '^\s*$' | tail -1))"
    return 1
  fi
  has_image "$tool" "$RUST_IMAGE" && has_image "$tool" "$RUNTIME_IMAGE"
}

chosen=""
why=()
for tool in "${tools[@]}"; do
  case "$tool" in docker | podman | buildah) ;; *) say "unknown tool $tool"; exit 2 ;; esac
  if usable "$tool"; then
    chosen=$tool
    break
  fi
  why+=("$tool: $reason")
done
if [ -z "$chosen" ]; then
  say "no tool can build the images here:"
  for line in "${why[@]}"; do say "  $line"; done
  say "needs one of docker (with a running engine), podman or buildah, and both base images reachable:"
  say "  $RUST_IMAGE and $RUNTIME_IMAGE (or RUST_IMAGE/RUNTIME_IMAGE naming images that are)"
  exit 2
fi

for f in "${dockerfiles[@]}"; do
  image=$(image_of "$f")
  say "$chosen: building $image from $f"
  args=(-f "$f" -t "$image" --build-arg "RUST_IMAGE=$RUST_IMAGE" --build-arg "RUNTIME_IMAGE=$RUNTIME_IMAGE" .)
  case "$chosen" in
    docker | podman) "$chosen" build "${args[@]}" ;;
    buildah) buildah build "${args[@]}" ;;
  esac
done
say "built: $(for f in "${dockerfiles[@]}"; do printf '%s ' "$(image_of "$f")"; done)"

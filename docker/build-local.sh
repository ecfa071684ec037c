#!/usr/bin/env bash
# Build kvroute's image with podman on a machine that reaches Debian's packages and PyPI but
# no image registry, then smoke-test it. Steps (the base is made once):
#   1. base: a Debian bookworm image made from Debian's packages (debootstrap | podman
#      import), since no registry can hand us debian:bookworm-slim;
#   2. build: `podman build` of docker/Dockerfile on that base, with the local wheel folder
#      (the CPU torch wheel) as the build context `wheels`;
#   3. smoke: `kvroute serve --engine sim` in the container answers one completion, and a
#      login shell (how KubeRay starts pods) finds `ray` on PATH.
# docker/smoke-rayservice.sh then runs the image the way a KubeRay RayService head does.
# Usage: docker/build-local.sh [base|build|smoke|all]     (default: all; run as root)
# Env: VARIANT (cpu, the default, or cuda), IMAGE (the tag), WHEELS (default: pip's
#      global.find-links, else /opt/wheels), BASE_IMAGE, MIRROR (Debian mirror),
#      HOST_CA_BUNDLE (TLS trust for pip and uv in the build), REBUILD_BASE=1 (remake the base).
set -euo pipefail
cd "$(dirname "$0")/.."

source docker/podman-env.sh
BASE_IMAGE=${BASE_IMAGE:-localhost/debian-debootstrap:bookworm}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
HOST_CA_BUNDLE=${HOST_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
WHEELS=${WHEELS:-$(python3 -m pip config get global.find-links 2>/dev/null || echo /opt/wheels)}

ensure_tools() {
  local missing=()
  command -v debootstrap >/dev/null || missing+=(debootstrap)
  command -v podman >/dev/null || missing+=(podman)
  command -v "$PODMAN_RUNTIME" >/dev/null || missing+=("$PODMAN_RUNTIME")
  if ((${#missing[@]})); then
    log "installing ${missing[*]} from Debian's packages"
    apt-get update -q && apt-get install -y -q "${missing[@]}"
  fi
}

# A minimal bookworm rootfs trimmed like debian:bookworm-slim (no docs, man pages or
# locales), imported as a one-layer image.
# A subshell, so its EXIT trap removes the rootfs whatever happens.
make_base() (
  if podman image exists "$BASE_IMAGE" && [[ ${REBUILD_BASE:-0} != 1 ]]; then
    log "base image $BASE_IMAGE exists"
    exit 0
  fi
  rootfs=$(mktemp -d /var/tmp/kvroute-rootfs.XXXXXX)
  trap 'rm -rf "$rootfs"' EXIT
  log "debootstrap bookworm into $rootfs from $MIRROR"
  debootstrap --variant=minbase --include=ca-certificates bookworm "$rootfs" "$MIRROR" \
    >/var/tmp/kvroute-debootstrap.log 2>&1 \
    || { tail -20 /var/tmp/kvroute-debootstrap.log >&2; exit 1; }
  cat >"$rootfs/etc/dpkg/dpkg.cfg.d/slim" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
EOF
  rm -f "$rootfs/etc/apt/sources.list"
  cat >"$rootfs/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $MIRROR
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: ${MIRROR%/debian}/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/archives/*.deb \
    "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/locale/*
  log "importing the rootfs as $BASE_IMAGE"
  tar -C "$rootfs" -c . | podman import \
    --change 'CMD ["/bin/bash"]' \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    - "$BASE_IMAGE" >/dev/null
)

build_image() {
  [[ -d $WHEELS ]] || { log "wheel folder $WHEELS not found (set WHEELS)"; return 1; }
  log "podman build $IMAGE (VARIANT=$VARIANT, wheels from $WHEELS)"
  local start=$SECONDS
  # --network host: the build's RUN steps reach Debian's packages and PyPI the way the host
  # does, and the host's CA bundle (which trusts this network's TLS-inspecting egress proxy)
  # is mounted for pip and uv (a bind mount: it stays out of the image). TORCH_CPU_INDEX is
  # empty: the CPU torch wheel comes from the wheel folder.
  podman build "${PODMAN_OPTS[@]}" --network host -f docker/Dockerfile -t "$IMAGE" \
    --build-arg VARIANT="$VARIANT" --build-arg BASE_IMAGE="$BASE_IMAGE" \
    --build-arg TORCH_CPU_INDEX= --build-context wheels="$WHEELS" \
    -v "$HOST_CA_BUNDLE:/run/host-ca.crt:ro" --build-arg CA_BUNDLE=/run/host-ca.crt .
  log "built $IMAGE in $((SECONDS - start)) s; size: $(podman image inspect "$IMAGE" \
    --format '{{.Size}}' | awk '{printf "%.0f MB", $1 / 1e6}')"
}

smoke() {
  local shell_check
  shell_check=$(podman run "${PODMAN_OPTS[@]}" --rm --entrypoint /bin/bash "$IMAGE" \
    -lc 'echo "$(id -un) uid $(id -u) in $PWD: $(command -v ray) $(ray --version)"')
  log "login shell (as KubeRay runs pods): $shell_check"
  local port name deadline reply
  port=$(free_port)
  name=kvroute-smoke-$$
  log "kvroute serve --engine sim in $name on 127.0.0.1:$port (host network)"
  # Ray keeps its object store in /dev/shm: give it more than podman's 64 MiB default.
  # No --rm: a container that exits early keeps its log for the message below.
  podman run "${PODMAN_OPTS[@]}" -d --name "$name" --network host --shm-size 1g "$IMAGE" \
    serve --model tiny --engine sim --sim-preset tiny --replicas 1 --num-cpus 2 \
    --host 127.0.0.1 --port "$port" >/dev/null
  trap "podman rm -f -t 30 $name >/dev/null 2>&1 || true" EXIT
  deadline=$((SECONDS + 300))
  until curl -sf "http://127.0.0.1:$port/ready" >/dev/null; do
    if [[ $(podman inspect -f '{{.State.Running}}' "$name") != true ]] \
      || ((SECONDS > deadline)); then
      log "not ready after $((SECONDS - deadline + 300)) s; container log:"
      podman logs "$name" 2>&1 | tail -40 >&2 || true
      return 1
    fi
    sleep 2
  done
  log "ready after $((SECONDS - deadline + 300)) s; POST /v1/completions"
  reply=$(curl -sS --fail-with-body "http://127.0.0.1:$port/v1/completions" \
    -H 'Content-Type: application/json' \
    -d '{"model": "tiny", "prompt": "Hello from the container", "max_tokens": 8}')
  echo "$reply"
  python3 - "$reply" <<'EOF'
import json, sys
body = json.loads(sys.argv[1])
assert body["object"] == "text_completion", body
assert body["model"] == "tiny", body
assert body["usage"]["completion_tokens"] == 8, body
assert body["choices"][0]["finish_reason"] == "length", body
print("smoke test passed: 8 tokens from", body["model"], file=sys.stderr)
EOF
  podman stop -t 30 "$name" >/dev/null
  podman rm "$name" >/dev/null
  trap - EXIT
}

main() {
  local step=${1:-all}
  case $step in
    base) ensure_tools; make_base ;;
    build) ensure_tools; make_base; build_image ;;
    smoke) smoke ;;
    all) ensure_tools; make_base; build_image; smoke ;;
    *) echo "usage: $0 [base|build|smoke|all]" >&2; return 2 ;;
  esac
}

main "$@"

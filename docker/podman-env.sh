# Sourced by docker/build-local.sh and docker/smoke-rayservice.sh (from the repository root):
# the image name, and the podman options this kind of machine needs.
VERSION=$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml)
VARIANT=${VARIANT:-cpu}
IMAGE=${IMAGE:-localhost/kvroute:${VERSION}-${VARIANT}}

# What podman needs on a VM with a hybrid cgroup v1/v2 layout and no CAP_SYS_RESOURCE (as
# kvroute's development machines are), found by trying: runc, since crun 1.8 refuses the
# hybrid layout ("cgroups in hybrid mode not supported"); and ulimits the container may keep,
# since podman's defaults (nofile 1048576) exceed the hard limits and setrlimit fails
# ("Operation not permitted"). 32768 processes is the most podman's runtime could set here.
PODMAN_RUNTIME=${PODMAN_RUNTIME:-runc}
NOFILE=$(ulimit -Hn)
NPROC=$(ulimit -Hu)
[[ $NPROC == unlimited || $NPROC -gt 32768 ]] && NPROC=32768
PODMAN_OPTS=(--runtime "$PODMAN_RUNTIME" --ulimit "nofile=$NOFILE:$NOFILE"
             --ulimit "nproc=$NPROC:$NPROC")

log() { printf '[%s] %s\n' "$(basename "$0" .sh)" "$*" >&2; }

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])'
}

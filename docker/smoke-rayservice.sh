#!/usr/bin/env bash
# Run the image the way a KubeRay RayService runs its head, without Kubernetes:
#   - the chart rendered with simulated engines (`helm template`); its head container's image
#     must be the image under test (the chart's default tag for engine.engine sim);
#   - the head's rayStartParams turned into KubeRay's command, under KubeRay's entrypoint
#     override `/bin/bash -lc -- "ulimit -n 65536; ray start --head ... --block"`;
#   - KubeRay's readiness probe (wget | grep success on the raylet and GCS health endpoints);
#   - the serveConfigV2 deployed through the dashboard (`serve deploy`, the REST call KubeRay
#     makes), then one completion through the Serve proxy on port 8000.
# Bridge networking with port 8000 published on a free port of 127.0.0.1, so Ray's default
# ports (6379, 8265, 52365) stay inside the container.
# Usage: docker/smoke-rayservice.sh   (after docker/build-local.sh; helm from
#        tests/setup_system.sh, or HELM=path)
set -euo pipefail
cd "$(dirname "$0")/.."
source docker/podman-env.sh
HELM=${HELM:-.cache/bin/helm}

work=$(mktemp -d /var/tmp/kvroute-rayservice.XXXXXX)
name=kvroute-rayservice-$$
cleanup() { podman rm -f -t 10 "$name" >/dev/null 2>&1 || true; rm -rf "$work"; }
trap cleanup EXIT
chmod 0777 "$work"  # the image's uid 1000 writes the extracted config here

log "helm template: engine.engine=sim, 1 engine replica"
"$HELM" template smoke helm/kvroute --set engine.engine=sim --set engine.replicas=1 \
  >"$work/manifests.yaml"
# The image's own Python (it has PyYAML, as Ray needs it) reads the RayService.
podman run "${PODMAN_OPTS[@]}" --rm -v "$work:/work" --entrypoint python "$IMAGE" -c '
import yaml
docs = [d for d in yaml.safe_load_all(open("/work/manifests.yaml")) if isinstance(d, dict)]
(service,) = [d for d in docs if d["kind"] == "RayService"]
head = service["spec"]["rayClusterConfig"]["headGroupSpec"]
(container,) = head["template"]["spec"]["containers"]
params = " ".join(f"--{key}={value}" for key, value in head["rayStartParams"].items())
open("/work/image", "w").write(container["image"])
open("/work/ray-start-params", "w").write(params)
open("/work/serve.yaml", "w").write(service["spec"]["serveConfigV2"])
'
chart_image=$(<"$work/image")
[[ $chart_image == "$IMAGE" ]] || { log "the chart runs $chart_image, not $IMAGE"; exit 1; }
start="ulimit -n 65536; ray start --head $(<"$work/ray-start-params") --metrics-export-port=8080"
start+=" --num-cpus=2 --block"
port=$(free_port)
log "head container $name (the chart's image $chart_image), 127.0.0.1:$port -> 8000"
log "command: /bin/bash -lc -- '$start'"
podman run "${PODMAN_OPTS[@]}" -d --name "$name" --shm-size 1g -p "127.0.0.1:$port:8000" \
  -v "$work:/work:ro" --entrypoint /bin/bash "$IMAGE" -lc -- "$start" >/dev/null

# Polls a command until it succeeds, with a deadline; prints the head's log on failure.
wait_for() {
  local what=$1 deadline=$((SECONDS + $2)) start_s=$SECONDS
  shift 2
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS > deadline)) || [[ $(podman inspect -f '{{.State.Running}}' "$name") != true ]]
    then
      log "$what: not after $((SECONDS - start_s)) s; head log:"
      podman logs "$name" 2>&1 | tail -30 >&2
      return 1
    fi
    sleep 2
  done
  log "$what after $((SECONDS - start_s)) s"
}

probe='wget --tries 1 -T 2 -q -O- http://localhost:52365/api/local_raylet_healthz | grep success'
probe+=' && wget --tries 1 -T 2 -q -O- http://localhost:8265/api/gcs_healthz | grep success'
wait_for "KubeRay's readiness probe passes" 180 podman exec "$name" bash -c "$probe"
podman exec "$name" bash -lc 'serve deploy /work/serve.yaml' >&2
wait_for "the Serve application is ready" 300 curl -sf "http://127.0.0.1:$port/ready"

reply=$(curl -sS --fail-with-body "http://127.0.0.1:$port/v1/completions" \
  -H 'Content-Type: application/json' \
  -d '{"model": "tiny", "prompt": "Hello from a RayService head", "max_tokens": 8}')
echo "$reply"
python3 - "$reply" <<'EOF'
import json, sys
body = json.loads(sys.argv[1])
assert body["model"] == "tiny" and body["usage"]["completion_tokens"] == 8, body
print("RayService head smoke test passed: 8 tokens from tiny", file=sys.stderr)
EOF

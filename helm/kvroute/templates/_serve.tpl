{{/* How requests enter: gateway.ingress, or with workers the external gateway ("gateway"). */}}
{{- define "kvroute.ingress" -}}
{{- if .Values.workers }}gateway{{ else }}{{ .Values.gateway.ingress }}{{ end }}
{{- end }}

{{/* The port the Ray Serve proxy (the gateway) listens on: the OpenAI API and /metrics. */}}
{{- define "kvroute.gatewayPort" -}}8000{{- end }}

{{/* A Ray custom resource only the head offers, so external gateway replicas run there. */}}
{{- define "kvroute.gatewayResource" -}}kvroute_gateway{{- end }}

{{/*
"true" when the gateway processes are pinned to the head: the external gateways (they listen
on the head's port themselves). The Gateway deployment runs wherever Serve places it; with
ingress direct, Ray Serve itself pins `gateway.replicas` ingress request routers to every
pod with a proxy (RAY_SERVE_INGRESS_ROUTER_REPLICAS_PER_NODE), so a head-only resource
would leave those on engine pods unschedulable.
*/}}
{{- define "kvroute.gatewaysOnHead" -}}
{{- if .Values.workers }}true{{ end }}
{{- end }}

{{/* Where the API keys Secret is mounted in every pod. */}}
{{- define "kvroute.apiKeysDir" -}}/etc/kvroute/api-keys{{- end }}

{{/* The name the API serves the model under: model.servedName, else the checkpoint
directory's name, the repo id (without its revision), or tiny; with workers, the name they
serve (model.servedName, else the model arg as given). */}}
{{- define "kvroute.servedModelName" -}}
{{- if .Values.model.servedName }}
{{- .Values.model.servedName }}
{{- else if .Values.workers }}
{{- include "kvroute.modelArg" . }}
{{- else if eq .Values.model.source "huggingface" }}
{{- regexReplaceAll "@.*$" .Values.model.huggingface.repoId "" }}
{{- else }}
{{- base (include "kvroute.modelArg" .) }}
{{- end }}
{{- end }}

{{/*
The Ray Serve environment of every Ray container (router/serve/serve_env.py's serve_env):
throughput-optimized Serve, and with ingress direct HAProxy with the body and the API key
passed to the ingress request router.
*/}}
{{- define "kvroute.serveEnv" -}}
- name: RAY_SERVE_THROUGHPUT_OPTIMIZED
  value: "1"
{{- if eq (include "kvroute.ingress" .) "direct" }}
- name: RAY_SERVE_ENABLE_HA_PROXY
  value: "1"
- name: RAY_SERVE_INGRESS_REQUEST_ROUTER_FORWARD_BODY
  value: "1"
- name: RAY_SERVE_SESSION_ID_HEADER_KEY
  value: authorization
{{- /* Serve runs this many ingress request routers on each node with a proxy. */}}
- name: RAY_SERVE_INGRESS_ROUTER_REPLICAS_PER_NODE
  value: {{ .Values.gateway.replicas | int | quote }}
{{- end }}
{{- end }}

{{/*
Ray Serve config (serveConfigV2) of the kvroute application. `args` are the fields of
ServeSettings (router/serve/settings.py). A Serve proxy runs on every node (EveryNode), so
every pod answers the API and the head is no single point of failure; the Gateway
deployment (router/gateway/app.py) runs wherever Serve places it, and with autoscaling
Serve scales EngineReplica (router/serve/engine_replica.py). With `workers`, the app is the
external gateway (router/apps/external.py): its replicas, pinned to the head, listen on
the gateway port themselves, so no Serve proxy runs.
*/}}
{{- define "kvroute.serveConfig" -}}
{{- $engine := .Values.engine }}
{{- $routing := .Values.routing }}
{{- $args := dict
  "model" (include "kvroute.modelArg" .)
  "engine" $engine.engine
  "replicas" $engine.replicas
  "tp" $engine.tp
  "block_size" $engine.blockSize
  "num_blocks" $engine.numBlocks
  "num_host_blocks" (ternary $engine.hostTier.numBlocks 0 $engine.hostTier.enabled)
  "cpus_per_rank" $engine.cpusPerRank
  "gpus_per_rank" (ternary 1 0 (eq $engine.engine "real"))
  "policy" $routing.policy
  "approximate" $routing.approximate
  "load_weight" $routing.loadWeight
  "host_cost_fraction" $routing.hostCostFraction
  "pooled_sample_rate" .Values.pooledBound.sampleRate
  "pooled_window_s" .Values.pooledBound.windowSeconds
  "gateways" .Values.gateway.replicas
  "ingress" (include "kvroute.ingress" .)
}}
{{- $workers := .Values.workers }}
{{- if $workers }}
{{- $_ := set $args "workers" $workers }}
{{- $_ := set $args "model" (include "kvroute.servedModelName" .) }}
{{- $_ := set $args "tokenizer" (include "kvroute.modelArg" .) }}
{{- end }}
{{- if and .Values.model.servedName (empty $workers) }}
{{- $_ := set $args "served_model_name" .Values.model.servedName }}
{{- end }}
{{- if .Values.apiKeys.enabled }}
{{- $_ := set $args "api_keys_file" (printf "%s/%s" (include "kvroute.apiKeysDir" .) .Values.apiKeys.secretKey) }}
{{- end }}
{{- $gatewayOptions := dict "num_cpus" 0 }}
{{- if include "kvroute.gatewaysOnHead" . }}
{{- $_ := set $gatewayOptions "resources" (dict (include "kvroute.gatewayResource" .) 1) }}
{{- end }}
{{- /* the gateway processes: the Gateway ingress, or with ingress direct the routers */}}
{{- $gatewayDeployment := ternary "KVRouteIngressRouter" "Gateway" (eq (include "kvroute.ingress" .) "direct") }}
{{- $deployments := list (dict
  "name" (ternary "WorkerGateway" $gatewayDeployment (not (empty $workers)))
  "ray_actor_options" $gatewayOptions) }}
{{- if and $engine.autoscaling.enabled (empty $workers) }}
{{- $deployments = append $deployments (dict
  "name" "EngineReplica"
  "num_replicas" "auto"
  "autoscaling_config" (dict
    "initial_replicas" $engine.replicas
    "min_replicas" $engine.autoscaling.minReplicas
    "max_replicas" $engine.autoscaling.maxReplicas
    "target_ongoing_requests" $engine.autoscaling.targetOngoingRequests)) }}
{{- end }}
{{- $app := dict
  "name" "kvroute"
  "import_path" "router.apps.build:build_app"
  "args" $args
  "deployments" $deployments }}
{{- $httpOptions := dict "host" "0.0.0.0" "port" (int (include "kvroute.gatewayPort" .)) }}
{{- if $workers }}
{{- /* The external gateways listen on the gateway port themselves (no Serve proxy): the
port setting's default, as the port is never read from the environment (Kubernetes puts
KVROUTE_PORT=tcp://... into the pods of a namespace with a Service named kvroute). */}}
{{- $env := dict "KVROUTE_HOST" "0.0.0.0" }}
{{- $_ := set $app "runtime_env" (dict "env_vars" $env) }}
{{- toYaml (dict "proxy_location" "Disabled" "http_options" $httpOptions "applications" (list $app)) }}
{{- else }}
{{- $_ := set $app "route_prefix" "/" }}
{{- toYaml (dict "proxy_location" "EveryNode" "http_options" $httpOptions "applications" (list $app)) }}
{{- end }}
{{- end }}

{{/*
Checks across keys that values.schema.json cannot express; each fails the render with the
key to fix.
*/}}
{{- define "kvroute.validate" -}}
{{- $engine := .Values.engine }}
{{- $auto := $engine.autoscaling }}
{{- if $auto.enabled }}
{{- if gt (int $auto.minReplicas) (int $auto.maxReplicas) }}
{{- fail (printf "engine.autoscaling.minReplicas (%d) must not exceed engine.autoscaling.maxReplicas (%d)" (int $auto.minReplicas) (int $auto.maxReplicas)) }}
{{- end }}
{{- if or (lt (int $engine.replicas) (int $auto.minReplicas)) (gt (int $engine.replicas) (int $auto.maxReplicas)) }}
{{- fail (printf "engine.replicas (%d) must lie within engine.autoscaling bounds [%d, %d]" (int $engine.replicas) (int $auto.minReplicas) (int $auto.maxReplicas)) }}
{{- end }}
{{- end }}
{{- if eq .Values.upgradeStrategy.type "NewClusterWithIncrementalUpgrade" }}
{{- if or (not $auto.enabled) .Values.workers }}
{{- fail "upgradeStrategy.type NewClusterWithIncrementalUpgrade needs engine.autoscaling.enabled (KubeRay moves capacity through Serve's target_capacity and the Ray autoscaler) and no workers" }}
{{- end }}
{{- if or .Values.ingress.enabled .Values.httpRoute.enabled }}
{{- fail "upgradeStrategy.type NewClusterWithIncrementalUpgrade: KubeRay's own Gateway and HTTPRoute are the ingress; set ingress.enabled and httpRoute.enabled to false" }}
{{- end }}
{{- end }}
{{- if and .Values.httpRoute.enabled (empty .Values.httpRoute.parentRefs) }}
{{- fail "httpRoute.parentRefs must name the Gateway the route attaches to" }}
{{- end }}
{{- range $section := list "requests" "limits" }}
{{- if hasKey (get $engine.resources $section | default dict) "nvidia.com/gpu" }}
{{- fail (printf "engine.resources.%s must not set nvidia.com/gpu: the chart requests engine.tp GPUs per worker" $section) }}
{{- end }}
{{- end }}
{{- end }}

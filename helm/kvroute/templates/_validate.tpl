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
{{- range $section := list "requests" "limits" }}
{{- if hasKey (get $engine.resources $section | default dict) "nvidia.com/gpu" }}
{{- fail (printf "engine.resources.%s must not set nvidia.com/gpu: the chart requests engine.tp GPUs per worker" $section) }}
{{- end }}
{{- end }}
{{- end }}

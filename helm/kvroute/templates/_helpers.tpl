{{/* Names and labels shared by every kvroute resource. */}}

{{- define "kvroute.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* <release>-<chart>, or the release name when it already contains the chart name. */}}
{{- define "kvroute.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := include "kvroute.name" . }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "kvroute.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kvroute.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "kvroute.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "kvroute.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Labels that pick the head pod, where the gateway serves the API and /metrics. */}}
{{- define "kvroute.gatewaySelectorLabels" -}}
{{ include "kvroute.selectorLabels" . }}
app.kubernetes.io/component: gateway
{{- end }}

{{/*
The image. Without `image.tag`: the chart's appVersion and the variant docker/Dockerfile
builds for `engine.engine`, `cuda` for `real` (GPU engines), `cpu` for `sim`.
*/}}
{{- define "kvroute.image" -}}
{{- $variant := ternary "cuda" "cpu" (eq .Values.engine.engine "real") }}
{{- $tag := .Values.image.tag | default (printf "%s-%s" .Chart.AppVersion $variant) }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}

{{/* The --model argument: `tiny`, or the checkpoint directory inside the pods. */}}
{{- define "kvroute.modelArg" -}}
{{- if eq .Values.model.source "builtin" }}tiny
{{- else if eq .Values.model.source "image" }}{{ .Values.model.imagePath }}
{{- else }}{{ printf "%s/%s" (trimSuffix "/" .Values.model.pvc.mountPath) .Values.model.pvc.path }}
{{- end }}
{{- end }}

{{/*
Volumes and mounts every Ray pod gets, since gateway and engine actors need the model (and
the gateway the API keys) wherever Ray places them: the model claim when the model lives on
a PVC, the API keys Secret when keys are on.
*/}}
{{- define "kvroute.volumes" -}}
{{- if eq .Values.model.source "pvc" }}
- name: model
  persistentVolumeClaim:
    claimName: {{ .Values.model.pvc.claimName }}
    readOnly: true
{{- end }}
{{- if .Values.apiKeys.enabled }}
- name: api-keys
  secret:
    secretName: {{ .Values.apiKeys.secretName }}
{{- end }}
{{- end }}

{{- define "kvroute.volumeMounts" -}}
{{- if eq .Values.model.source "pvc" }}
- name: model
  mountPath: {{ .Values.model.pvc.mountPath }}
  readOnly: true
{{- end }}
{{- if .Values.apiKeys.enabled }}
- name: api-keys
  mountPath: {{ include "kvroute.apiKeysDir" . }}
  readOnly: true
{{- end }}
{{- end }}

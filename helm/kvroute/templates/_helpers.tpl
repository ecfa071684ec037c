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

{{/* Labels that pick the head pod (with `workers`, where the external gateways listen). */}}
{{- define "kvroute.gatewaySelectorLabels" -}}
{{ include "kvroute.selectorLabels" . }}
app.kubernetes.io/component: gateway
{{- end }}

{{/* The Service clients reach: KubeRay's serve Service (with `workers`, the chart's own). */}}
{{- define "kvroute.serviceName" -}}
{{- if or .Values.service.enabled .Values.workers }}
{{- include "kvroute.fullname" . }}
{{- else }}
{{- printf "%s-serve-svc" (include "kvroute.fullname" .) }}
{{- end }}
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

{{/* The --model argument: a builtin name, the checkpoint directory in the pods, or a repo id. */}}
{{- define "kvroute.modelArg" -}}
{{- if eq .Values.model.source "builtin" }}{{ .Values.model.builtin }}
{{- else if eq .Values.model.source "image" }}{{ .Values.model.imagePath }}
{{- else if eq .Values.model.source "huggingface" }}{{ .Values.model.huggingface.repoId }}
{{- else }}{{ printf "%s/%s" (trimSuffix "/" .Values.model.pvc.mountPath) .Values.model.pvc.path }}
{{- end }}
{{- end }}

{{/*
The environment of every Ray container: the Ray Serve environment, where the Hugging Face
cache is (and its token), the admin key, that keys are required when they are on, the
request limits and pin quotas, then the operator's extraEnv (last, so it wins).
*/}}
{{- define "kvroute.env" -}}
{{- $hf := .Values.model.huggingface }}
{{ include "kvroute.serveEnv" . }}
{{- if eq .Values.model.source "huggingface" }}
- name: HF_HUB_CACHE
  value: {{ $hf.cache.mountPath | quote }}
{{- if $hf.offline }}
- name: HF_HUB_OFFLINE
  value: "1"
{{- end }}
{{- if $hf.tokenSecretName }}
- name: HF_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ $hf.tokenSecretName }}
      key: {{ $hf.tokenSecretKey }}
{{- end }}
{{- end }}
{{- /* keys on: a process that finds none (an empty Secret) refuses to start */}}
{{- if .Values.apiKeys.enabled }}
- name: KVROUTE_REQUIRE_API_KEYS
  value: "1"
{{- end }}
{{- if .Values.adminKey.enabled }}
- name: KVROUTE_ADMIN_KEY
  valueFrom:
    secretKeyRef:
      name: {{ .Values.adminKey.secretName }}
      key: {{ .Values.adminKey.secretKey }}
- name: KVROUTE_REQUIRE_ADMIN_KEY
  value: "1"
{{- end }}
{{- with .Values.limits }}
- name: KVROUTE_MAX_BODY_BYTES
  value: {{ .maxBodyBytes | int64 | quote }}
- name: KVROUTE_MAX_PROMPT_CHARS
  value: {{ .maxPromptChars | int64 | quote }}
- name: KVROUTE_MAX_SEQUENCES_PER_REQUEST
  value: {{ .maxSequencesPerRequest | int64 | quote }}
{{- if $.Values.apiKeys.enabled }}{{/* without keys: one anonymous user, no stream cap */}}
- name: KVROUTE_MAX_STREAMS_PER_TENANT
  value: {{ .maxStreamsPerTenant | int64 | quote }}
{{- end }}
- name: KVROUTE_PIN_MAX_NAMES_PER_TENANT
  value: {{ .pinMaxNamesPerTenant | int64 | quote }}
- name: KVROUTE_PIN_MAX_BLOCKS_PER_TENANT
  value: {{ .pinMaxBlocksPerTenant | int64 | quote }}
{{- end }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
What every Ray container shares after its resources: env, envFrom, securityContext.
*/}}
{{- define "kvroute.containerCommon" -}}
{{- with include "kvroute.env" . | trim }}
env:
  {{- . | nindent 2 }}
{{- end }}
{{- with .Values.envFrom }}
envFrom:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.securityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
Scheduling and security of a Ray pod; `component` is the values section (gateway or engine).
*/}}
{{- define "kvroute.podCommon" -}}
{{- $component := index . 1 }}
{{- with index . 0 }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $component.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with $component.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $component.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $component.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.podSecurityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Volumes and mounts every Ray pod gets, since gateway and engine actors need the model (and
the gateway the API keys) wherever Ray places them: the model claim when the model lives on
a PVC, the Hugging Face cache for a repo id, the API keys Secret when keys are on.
*/}}
{{- define "kvroute.volumes" -}}
{{- $hf := .Values.model.huggingface }}
{{- if eq .Values.model.source "pvc" }}
- name: model
  persistentVolumeClaim:
    claimName: {{ .Values.model.pvc.claimName }}
    readOnly: true
{{- else if eq .Values.model.source "huggingface" }}
- name: hf-cache
  {{- if $hf.cache.claimName }}
  persistentVolumeClaim:
    claimName: {{ $hf.cache.claimName }}
  {{- else }}
  emptyDir:
    sizeLimit: {{ $hf.cache.sizeLimit }}
  {{- end }}
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
{{- else if eq .Values.model.source "huggingface" }}
- name: hf-cache
  mountPath: {{ .Values.model.huggingface.cache.mountPath }}
{{- end }}
{{- if .Values.apiKeys.enabled }}
- name: api-keys
  mountPath: {{ include "kvroute.apiKeysDir" . }}
  readOnly: true
{{- end }}
{{- end }}

{{/* Names, labels and the pieces the head, the worker groups and the extra front doors share. */}}

{{- define "tetriserve.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "tetriserve.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* The RayCluster: at most 50 characters, so KubeRay keeps its name for pods, the head Service and the token
Secret (utils.CheckName) */}}
{{- define "tetriserve.rayClusterName" -}}
{{- include "tetriserve.fullname" . }}
{{- end }}

{{/* KubeRay names the head Service <raycluster>-head-svc */}}
{{- define "tetriserve.headService" -}}
{{- printf "%s-head-svc" (include "tetriserve.rayClusterName" .) }}
{{- end }}

{{- define "tetriserve.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "tetriserve.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tetriserve.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "tetriserve.labels" -}}
helm.sh/chart: {{ include "tetriserve.chart" . }}
{{ include "tetriserve.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: tetriserve
{{- end }}

{{/* What the gRPC and HTTP Services select: every pod that runs a front door (the head, the extra ones) */}}
{{- define "tetriserve.frontDoorSelector" -}}
{{ include "tetriserve.selectorLabels" . }}
tetriserve.io/front-door: "true"
{{- end }}

{{- define "tetriserve.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "tetriserve.apiKeySecret" -}}
{{- if .Values.apiKey.existingSecret }}
{{- .Values.apiKey.existingSecret }}
{{- else if .Values.apiKey.value }}
{{- printf "%s-api-key" (include "tetriserve.fullname" .) }}
{{- end }}
{{- end }}

{{- define "tetriserve.rayAuthSecret" -}}
{{- default (include "tetriserve.rayClusterName" .) .Values.rayAuth.secretName }}
{{- end }}

{{- define "tetriserve.scheme" -}}
{{- if .Values.tls.enabled }}HTTPS{{ else }}HTTP{{ end }}
{{- end }}

{{/* Environment of a front door's container: the API key from its Secret */}}
{{- define "tetriserve.apiKeyEnv" -}}
{{- with include "tetriserve.apiKeySecret" . }}
- name: TETRISERVE_API_KEY
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: {{ $.Values.apiKey.secretKey }}
{{- end }}
{{- end }}

{{/* Flags both `serve` and `frontdoor` take: ports, the bind address, TLS */}}
{{- define "tetriserve.frontDoorArgs" -}}
- --grpc-port
- {{ .Values.serve.grpcPort | quote }}
- --http-port
- {{ .Values.serve.httpPort | quote }}
{{- if .Values.tls.enabled }}
- --tls-cert
- {{ printf "%s/tls.crt" .Values.tls.mountPath }}
- --tls-key
- {{ printf "%s/tls.key" .Values.tls.mountPath }}
{{- end }}
{{- end }}

{{- define "tetriserve.frontDoorPorts" -}}
- name: grpc
  containerPort: {{ .Values.serve.grpcPort }}
  protocol: TCP
- name: http
  containerPort: {{ .Values.serve.httpPort }}
  protocol: TCP
{{- end }}

{{- define "tetriserve.probes" -}}
{{- $scheme := include "tetriserve.scheme" . -}}
startupProbe:
  httpGet: {path: /health, port: http, scheme: {{ $scheme }}}
  {{- toYaml .Values.probes.startup | nindent 2 }}
livenessProbe:
  httpGet: {path: /health, port: http, scheme: {{ $scheme }}}
  {{- toYaml .Values.probes.liveness | nindent 2 }}
readinessProbe:
  httpGet: {path: /ready, port: http, scheme: {{ $scheme }}}
  {{- toYaml .Values.probes.readiness | nindent 2 }}
{{- end }}

{{/* Volumes every pod mounts: the model; front doors add TLS */}}
{{- define "tetriserve.modelVolume" -}}
{{- with .Values.model.volume }}
- name: model
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{- define "tetriserve.modelMount" -}}
{{- if .Values.model.volume }}
- name: model
  mountPath: {{ .Values.model.mountPath }}
  readOnly: true
{{- end }}
{{- end }}

{{- define "tetriserve.tlsVolume" -}}
{{- if .Values.tls.enabled }}
- name: tls
  secret:
    secretName: {{ .Values.tls.secretName }}
{{- end }}
{{- end }}

{{- define "tetriserve.tlsMount" -}}
{{- if .Values.tls.enabled }}
- name: tls
  mountPath: {{ .Values.tls.mountPath }}
  readOnly: true
{{- end }}
{{- end }}

{{- define "tetriserve.configMountPath" -}}/etc/tetriserve/config{{- end }}

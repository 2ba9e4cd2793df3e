{{/* Chart name, or nameOverride. */}}
{{- define "ledgerlake.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified name: the release name when it contains the chart name. */}}
{{- define "ledgerlake.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "ledgerlake.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "ledgerlake.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ledgerlake.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "ledgerlake.labels" -}}
helm.sh/chart: {{ include "ledgerlake.chart" . }}
{{ include "ledgerlake.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* ledgerlake.toml: .Values.config, or the chart's files/ledgerlake.toml. */}}
{{- define "ledgerlake.config" -}}
{{- if .Values.config }}
{{- .Values.config }}
{{- else }}
{{- .Files.Get "files/ledgerlake.toml" }}
{{- end }}
{{- end }}

{{/* What LOOKUP answers: .Values.advertisedAddress, or the Service's DNS name. */}}
{{- define "ledgerlake.advertisedAddress" -}}
{{- if .Values.advertisedAddress }}
{{- .Values.advertisedAddress }}
{{- else }}
{{- printf "%s.%s.svc:%v" (include "ledgerlake.fullname" .) .Release.Namespace .Values.service.ports.pulsar }}
{{- end }}
{{- end }}

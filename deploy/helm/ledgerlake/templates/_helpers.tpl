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

{{/* ledgerlake.toml: .Values.config, or the chart's files/ledgerlake.toml (a single node only:
every node of a cluster needs the same lake, which the default file's local one is not). */}}
{{- define "ledgerlake.config" -}}
{{- if .Values.config }}
{{- .Values.config }}
{{- else if .Values.cluster.enabled }}
{{- fail "cluster.enabled needs config: a ledgerlake.toml whose lake every node reaches (an S3 warehouse and a PostgreSQL catalog), e.g. --set-file config=deploy/helm/ledgerlake/files/cluster.toml" }}
{{- else }}
{{- .Files.Get "files/ledgerlake.toml" }}
{{- end }}
{{- end }}

{{/* A cluster node's DNS name: its pod's, through the headless Service ($(POD_NAME) is
expanded by Kubernetes from the container's POD_NAME variable). */}}
{{- define "ledgerlake.podHost" -}}
{{- printf "$(POD_NAME).%s-headless.%s.svc" (include "ledgerlake.fullname" .) .Release.Namespace }}
{{- end }}

{{/* Pods: one, or cluster.replicas nodes with cluster.enabled. */}}
{{- define "ledgerlake.replicas" -}}
{{- if .Values.cluster.enabled }}
{{- .Values.cluster.replicas }}
{{- else }}
{{- 1 }}
{{- end }}
{{- end }}

{{/* What LOOKUP answers: a cluster node's pod DNS name, .Values.advertisedAddress, or the
Service's DNS name. */}}
{{- define "ledgerlake.advertisedAddress" -}}
{{- if .Values.cluster.enabled }}
{{- if .Values.advertisedAddress }}
{{- fail "advertisedAddress cannot be set with cluster.enabled: each node advertises its pod" }}
{{- end }}
{{- printf "%s:6650" (include "ledgerlake.podHost" .) }}
{{- else if .Values.advertisedAddress }}
{{- .Values.advertisedAddress }}
{{- else }}
{{- printf "%s.%s.svc:%v" (include "ledgerlake.fullname" .) .Release.Namespace .Values.service.ports.pulsar }}
{{- end }}
{{- end }}

{{/* The pods' affinity: .Values.affinity when set; else, with cluster.enabled, the nodes spread
over hosts (cluster.antiAffinity: soft prefers it, hard requires it, none leaves it to the
scheduler), so that losing a host costs the cluster one node. */}}
{{- define "ledgerlake.affinity" -}}
{{- $mode := toString .Values.cluster.antiAffinity }}
{{- if .Values.affinity }}
affinity:
  {{- toYaml .Values.affinity | nindent 2 }}
{{- else if and .Values.cluster.enabled (eq $mode "hard") }}
affinity:
  podAntiAffinity:
    requiredDuringSchedulingIgnoredDuringExecution:
      - labelSelector:
          matchLabels:
            {{- include "ledgerlake.selectorLabels" . | nindent 12 }}
        topologyKey: kubernetes.io/hostname
{{- else if and .Values.cluster.enabled (eq $mode "soft") }}
affinity:
  podAntiAffinity:
    preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 100
        podAffinityTerm:
          labelSelector:
            matchLabels:
              {{- include "ledgerlake.selectorLabels" . | nindent 14 }}
          topologyKey: kubernetes.io/hostname
{{- else if and .Values.cluster.enabled (ne $mode "none") }}
{{- fail "cluster.antiAffinity is soft, hard or none" }}
{{- end }}
{{- end }}

{{/* The pod spec's `affinity` field, indented for it, after a newline; nothing without one
(so that no line of spaces is left where it would go). */}}
{{- define "ledgerlake.affinityField" -}}
{{- with include "ledgerlake.affinity" . | trim }}
{{ . | indent 6 }}
{{- end }}
{{- end }}

{{/* The chart's etcd (cluster.etcd, deployed when cluster.metadataUrl is empty): the name of
its StatefulSet and headless Service, and its pods' labels (not the nodes': neither selects the
other's pods). */}}
{{- define "ledgerlake.etcdName" -}}
{{- printf "%s-etcd" (include "ledgerlake.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "ledgerlake.etcdSelectorLabels" -}}
app.kubernetes.io/name: {{ include "ledgerlake.name" . }}-etcd
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: etcd
{{- end }}

{{/* Member i of the chart's etcd: its pod's DNS name through the headless Service. */}}
{{- define "ledgerlake.etcdHost" -}}
{{- $name := include "ledgerlake.etcdName" .root }}
{{- printf "%s-%d.%s.%s.svc" $name (int .i) $name .root.Release.Namespace }}
{{- end }}

{{/* etcd's --initial-cluster: every member's name (its pod's) and peer URL. */}}
{{- define "ledgerlake.etcdInitialCluster" -}}
{{- $members := list }}
{{- range $i := until (int .Values.cluster.etcd.replicas) }}
{{- $host := include "ledgerlake.etcdHost" (dict "root" $ "i" $i) }}
{{- $members = append $members (printf "%s-%d=http://%s:2380" (include "ledgerlake.etcdName" $) $i $host) }}
{{- end }}
{{- join "," $members }}
{{- end }}

{{/* The nodes' metadata store: cluster.metadataUrl, or every member of the chart's etcd. */}}
{{- define "ledgerlake.metadataUrl" -}}
{{- if .Values.cluster.metadataUrl }}
{{- .Values.cluster.metadataUrl }}
{{- else }}
{{- $members := list }}
{{- range $i := until (int .Values.cluster.etcd.replicas) }}
{{- $members = append $members (printf "%s:2379" (include "ledgerlake.etcdHost" (dict "root" $ "i" $i))) }}
{{- end }}
{{- printf "etcd://%s" (join "," $members) }}
{{- end }}
{{- end }}

{{- define "ledgerlake.etcdLabels" -}}
helm.sh/chart: {{ include "ledgerlake.chart" . }}
{{ include "ledgerlake.etcdSelectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

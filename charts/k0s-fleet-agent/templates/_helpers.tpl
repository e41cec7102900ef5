{{/* Chart name, truncated to the 63 characters a label value allows. */}}
{{- define "k0s-fleet-agent.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full object name prefix: <release>-<chart>, or <release> when it already names the chart. */}}
{{- define "k0s-fleet-agent.fullname" -}}
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

{{- define "k0s-fleet-agent.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Selector labels: stable for the life of a release (Deployment selectors are immutable). */}}
{{- define "k0s-fleet-agent.selectorLabels" -}}
app.kubernetes.io/name: {{ include "k0s-fleet-agent.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: agent
{{- end }}

{{/* Recommended labels (https://kubernetes.io/docs/concepts/overview/working-with-objects/common-labels/). */}}
{{- define "k0s-fleet-agent.labels" -}}
helm.sh/chart: {{ include "k0s-fleet-agent.chart" . }}
{{ include "k0s-fleet-agent.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: k0s-fleet
{{- end }}

{{- define "k0s-fleet-agent.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "k0s-fleet-agent.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create=false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "k0s-fleet-agent.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{/* The restart strategies that need a privileged container (nsenter into pid 1). */}}
{{- define "k0s-fleet-agent.privileged" -}}
{{- if has .Values.restart.strategy (list "systemd" "command") }}true{{ end }}
{{- end }}

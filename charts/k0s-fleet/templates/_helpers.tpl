{{/* Chart name, truncated to the 63 characters a label value allows. */}}
{{- define "k0s-fleet.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full object name prefix: <release>-<chart>, or <release> when it already names the chart. */}}
{{- define "k0s-fleet.fullname" -}}
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

{{- define "k0s-fleet.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Selector labels: stable for the life of a release (Deployment selectors are immutable). */}}
{{- define "k0s-fleet.selectorLabels" -}}
app.kubernetes.io/name: {{ include "k0s-fleet.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: controller
{{- end }}

{{/* Recommended labels (https://kubernetes.io/docs/concepts/overview/working-with-objects/common-labels/). */}}
{{- define "k0s-fleet.labels" -}}
helm.sh/chart: {{ include "k0s-fleet.chart" . }}
{{ include "k0s-fleet.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: k0s-fleet
{{- end }}

{{- define "k0s-fleet.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "k0s-fleet.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create=false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "k0s-fleet.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{/* Fixed names the controller uses in its own namespace (fleet/controllers/leader.py,
fleet/rollout/annotations.py). */}}
{{- define "k0s-fleet.leaseName" -}}k0s-fleet-controller{{- end }}
{{- define "k0s-fleet.rolloutConfigMap" -}}k0s-fleet-rollout{{- end }}

{{/* Namespaces the controller works in (JSON list): rbac.namespaces, else
fleet.clusters.namespaces plus the namespaces of fleet.clusters.entries (the controller
watches those too); empty = all namespaces. */}}
{{- define "k0s-fleet.workNamespaces" -}}
{{- $clusters := .Values.fleet.clusters | default dict }}
{{- $ns := .Values.rbac.namespaces | default list }}
{{- if and (not $ns) $clusters.namespaces }}
{{- $ns = $clusters.namespaces }}
{{- range ($clusters.entries | default list) }}
{{- if .namespace }}{{- $ns = append $ns .namespace }}{{- end }}
{{- end }}
{{- end }}
{{- $ns | uniq | toJson }}
{{- end }}

{{- define "k0s-fleet.extensionName" -}}
{{- printf "%s-extension" (include "k0s-fleet.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "k0s-fleet.extensionSecretName" -}}
{{- if eq .Values.extension.tls.mode "secret" }}
{{- required "extension.tls.existingSecret is required when extension.tls.mode=secret" .Values.extension.tls.existingSecret }}
{{- else }}
{{- printf "%s-tls" (include "k0s-fleet.extensionName" .) }}
{{- end }}
{{- end }}

{{/* The chart's name, at most 63 characters. */}}
{{- define "gpupass.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's object names: <release>-gpupass, or the release name when it holds the chart's. */}}
{{- define "gpupass.fullname" -}}
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

{{- define "gpupass.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpupass.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: kubelet-plugin
{{- end }}

{{- define "gpupass.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "gpupass.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "gpupass.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "gpupass.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The plugin's own directory on the node: the service socket (--plugin-dir). */}}
{{- define "gpupass.pluginDir" -}}
{{- printf "%s/%s" (trimSuffix "/" .Values.kubelet.pluginsDir) .Values.driverName }}
{{- end }}

{{/*
Where the plugin keeps its checkpoint and writes the KEP-5304 metadata files that its CDI specs
bind-mount: /var/lib/kubelet/plugins/<driver> always (src/containers/dra/checkpoint.rs,
claim.rs metadata_host_path), whatever kubelet.pluginsDir says.
*/}}
{{- define "gpupass.stateDir" -}}
{{- printf "/var/lib/kubelet/plugins/%s" .Values.driverName }}
{{- end }}

{{- define "gpupass.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* `gpupass dra probe` for the startup and liveness probes. */}}
{{- define "gpupass.probe" -}}
exec:
  command:
  - /usr/bin/gpupass
  - dra
  - probe
  - --driver={{ .Values.driverName }}
  - --registry-dir={{ .Values.kubelet.registrationDir }}
  - --plugin-dir={{ include "gpupass.pluginDir" . }}
  - --timeout-s={{ .Values.kubeletPlugin.probe.timeoutSeconds }}
{{- /* Two calls of at most timeoutSeconds each, and the process's start. */}}
timeoutSeconds: {{ add (mul 2 .Values.kubeletPlugin.probe.timeoutSeconds) 5 }}
{{- end }}

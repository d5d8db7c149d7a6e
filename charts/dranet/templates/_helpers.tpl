{{- define "dranet.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "dranet.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "dranet.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "dranet.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "dranet.labels" -}}
app.kubernetes.io/name: {{ include "dranet.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "dranet.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dranet.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "dranet.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "dranet.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The image of one component: component.image.* over image.*. Call with (list $ "store"). */}}
{{- define "dranet.image" -}}
{{- $root := index . 0 -}}
{{- $c := index $root.Values (index . 1) -}}
{{- $repo := default $root.Values.image.repository $c.image.repository -}}
{{- $tag := default (default $root.Chart.AppVersion $root.Values.image.tag) $c.image.tag -}}
{{- printf "%s:%s" $repo $tag -}}
{{- end -}}

{{- define "dranet.pullPolicy" -}}
{{- $root := index . 0 -}}
{{- $c := index $root.Values (index . 1) -}}
{{- default $root.Values.image.pullPolicy $c.image.pullPolicy -}}
{{- end -}}

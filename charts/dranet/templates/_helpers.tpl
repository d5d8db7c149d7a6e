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

{{/* The pod's IP (the node's, with hostNetwork): where the kubelet sends gRPC probes. */}}
{{- define "dranet.podIPEnv" -}}
- name: POD_IP
  valueFrom: {fieldRef: {fieldPath: status.podIP}}
{{- end -}}

{{/* grpc.health.v1 on a TCP port of the component's own, at the pod IP. (list $ "store") */}}
{{- define "dranet.healthArgs" -}}
{{- $root := index . 0 -}}
{{- $c := index $root.Values (index . 1) -}}
- --health-address=$(POD_IP)
- --health-port={{ $c.healthPort }}
{{- end -}}

{{/* Native gRPC probes. Readiness asks for the component's own status (dranet.<component>),
     liveness only whether the process answers ("liveness"): a component that is up but not
     ready (attach without NRI, prepare not yet registered) is not restarted for it. Startup
     asks for readiness only of the store, since the other three start once it passes. */}}
{{- define "dranet.probes" -}}
{{- $root := index . 0 -}}
{{- $name := index . 1 -}}
{{- $c := index $root.Values $name -}}
{{- $p := $root.Values.probes -}}
startupProbe:
  grpc: {port: {{ $c.healthPort }}, service: {{ if eq $name "store" }}"dranet.store"{{ else }}liveness{{ end }}}
  periodSeconds: 1
  timeoutSeconds: {{ $p.timeoutSeconds }}
  failureThreshold: {{ $p.startupSeconds }}
readinessProbe:
  grpc: {port: {{ $c.healthPort }}, service: {{ printf "dranet.%s" $name | quote }}}
  periodSeconds: {{ $p.readinessPeriodSeconds }}
  timeoutSeconds: {{ $p.timeoutSeconds }}
  failureThreshold: 1
livenessProbe:
  grpc: {port: {{ $c.healthPort }}, service: liveness}
  periodSeconds: {{ $p.livenessPeriodSeconds }}
  timeoutSeconds: {{ $p.timeoutSeconds }}
  failureThreshold: {{ $p.livenessFailureThreshold }}
{{- end -}}

{{/* --feature-gates from .Values.featureGates (keys in name order), or nothing when empty. */}}
{{- define "dranet.featureGatesArg" -}}
{{- $pairs := list -}}
{{- range $name, $on := .Values.featureGates -}}
{{- $pairs = append $pairs (printf "%s=%t" $name $on) -}}
{{- end -}}
{{- if $pairs -}}
- --feature-gates={{ join "," $pairs }}
{{- end -}}
{{- end -}}

{{- define "fusebox.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "fusebox.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "fusebox.selectorLabels" -}}
app.kubernetes.io/name: {{ include "fusebox.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "fusebox.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "fusebox.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* The Secret that holds the admin token, and its key. */}}
{{- define "fusebox.tokenSecret" -}}
{{- if .Values.auth.existingSecret -}}{{ .Values.auth.existingSecret }}{{- else -}}{{ include "fusebox.fullname" . }}-token{{- end -}}
{{- end -}}
{{- define "fusebox.tokenKey" -}}
{{- if .Values.auth.existingSecret -}}{{ .Values.auth.existingSecretKey }}{{- else -}}token{{- end -}}
{{- end -}}

{{/* The key of the scrapers' token (role metrics) in the token Secret. */}}
{{- define "fusebox.metricsTokenKey" -}}
{{- if .Values.auth.existingSecret -}}{{ .Values.auth.existingSecretMetricsKey }}{{- else -}}metrics-token{{- end -}}
{{- end -}}

{{/* Whether scrapers show a token of their own (role metrics). */}}
{{- define "fusebox.metricsToken" -}}
{{- if and .Values.auth.enabled (eq .Values.auth.metrics "token") -}}true{{- end -}}
{{- end -}}

{{/* Where the pod finds its files. */}}
{{- define "fusebox.configDir" -}}/etc/fusebox/config{{- end -}}
{{- define "fusebox.tlsDir" -}}/etc/fusebox/tls{{- end -}}
{{- define "fusebox.storeDir" -}}/etc/fusebox/store{{- end -}}
{{- define "fusebox.storeTlsDir" -}}/etc/fusebox/store-tls{{- end -}}
{{- define "fusebox.dataDir" -}}/var/lib/fusebox{{- end -}}
{{- define "fusebox.claim" -}}
{{- .Values.persistence.existingClaim | default (printf "%s-data" (include "fusebox.fullname" .)) -}}
{{- end -}}

{{/* The --store URL. */}}
{{- define "fusebox.storeUrl" -}}
{{- $s := .Values.store -}}
{{- if $s.clusterNodes -}}
{{- printf "%s://%s" (ternary "rediss-cluster" "redis-cluster" $s.tls) (join "," $s.clusterNodes) -}}
{{- else -}}
{{- if regexMatch "^[a-z-]+://[^/]*@" $s.redisUrl -}}
{{- fail "store.redisUrl must not hold a user or password: it would be in the pod's arguments; use store.user and store.passwordSecret" -}}
{{- end -}}
{{- $s.redisUrl -}}
{{- end -}}
{{- end -}}

{{/* HTTP or HTTPS on the HTTP port. */}}
{{- define "fusebox.httpScheme" -}}
{{- if and .Values.tls.enabled .Values.tls.http -}}HTTPS{{- else -}}HTTP{{- end -}}
{{- end -}}

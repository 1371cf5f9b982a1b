{{/* The labels of every object: the value `labels` (config/default's labels by default). */}}
{{- define "kmm.labels" -}}
{{- toYaml .Values.labels }}
{{- end }}

{{/* The operator pod's labels, also the selector of its Deployment and Services. */}}
{{- define "kmm.selectorLabels" -}}
app.kubernetes.io/name: kmm
app.kubernetes.io/component: operator
{{- end }}

{{/* self (the operator provisions and rotates the webhook certificate) or none (cert-manager does). */}}
{{- define "kmm.certManagement" -}}
{{- if .Values.certManager.enabled }}none{{ else }}self{{ end }}
{{- end }}

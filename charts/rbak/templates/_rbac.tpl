{{/*
The operator's permissions. Keep equal to what operator/rbak_operator uses:
tests/ship/test_rbac.py fails on any difference, in either direction.
*/}}

{{/* Cluster-scoped: what kopf needs to start and to peer. */}}
{{- define "rbak.operatorClusterRules" -}}
- apiGroups: [""]
  resources: [namespaces]
  verbs: [list, watch]
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [list, watch]
{{- if include "rbak.peeringEnabled" . }}
- apiGroups: [kopf.dev]
  resources: [clusterkopfpeerings]
  verbs: [get, list, watch, patch]
{{- end }}
{{- end -}}

{{/* Per watched namespace (or cluster-wide when watching all). */}}
{{- define "rbak.operatorNamespacedRules" -}}
- apiGroups: [rbak.io]
  resources: [rabbitmqbackups, rabbitmqrestores]
  verbs: [get, list, watch, patch]
- apiGroups: [rbak.io]
  resources: [rabbitmqbackups/status, rabbitmqrestores/status]
  verbs: [get, patch]
- apiGroups: [batch]
  resources: [jobs]
  verbs: [get, list, watch, create, delete]
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, create, patch, delete]
- apiGroups: [""]
  resources: [secrets]
  verbs: [get]
- apiGroups: [""]
  resources: [events]
  verbs: [create]
{{- if .Values.spark.enabled }}
- apiGroups: [sparkoperator.k8s.io]
  resources: [sparkapplications]
  verbs: [get, list, watch, create, delete]
{{- end }}
{{- if include "rbak.peeringEnabled" . }}
- apiGroups: [kopf.dev]
  resources: [kopfpeerings]
  verbs: [get, list, watch, patch]
{{- end }}
{{- end -}}

{{/* Spark driver pods (spark-on-kubernetes): executors, their service, config maps. */}}
{{- define "rbak.sparkDriverRules" -}}
- apiGroups: [""]
  resources: [pods, services, configmaps, persistentvolumeclaims]
  verbs: [get, list, watch, create, delete, deletecollection, patch]
{{- end -}}

{{/* Operator container args, passed to the image's entrypoint ("operator" role). */}}
{{- define "rbak.operatorArgs" -}}
- operator
{{- if .Values.watchNamespaces }}
{{- range .Values.watchNamespaces }}
- --namespace={{ . }}
{{- end }}
{{- else }}
- --all-namespaces
{{- end }}
{{- if include "rbak.peeringEnabled" . }}
- --peering={{ include "rbak.peeringName" . }}
{{- else }}
- --standalone
{{- end }}
- --liveness=http://0.0.0.0:{{ .Values.operator.healthPort }}/healthz
{{- end -}}

{{/* Operator configuration: the operator reads these at start-up. */}}
{{- define "rbak.operatorEnv" -}}
- name: RBAK_IMAGE
  value: {{ include "rbak.image" . | quote }}
- name: RBAK_IMAGE_PULL_POLICY
  value: {{ .Values.image.pullPolicy | quote }}
- name: RBAK_JOB_SERVICE_ACCOUNT
  value: {{ include "rbak.jobServiceAccountName" . | quote }}
- name: RBAK_JOB_RESOURCES
  value: {{ toJson .Values.defaults.jobResources | quote }}
{{- with .Values.defaults.storage }}
- name: RBAK_DEFAULT_STORAGE
  value: {{ toJson . | quote }}
{{- end }}
- name: RBAK_SPARK_ENABLED
  value: {{ .Values.spark.enabled | quote }}
{{- if .Values.spark.enabled }}
- name: RBAK_SPARK_IMAGE
  value: {{ include "rbak.sparkImage" . | quote }}
- name: RBAK_SPARK_SERVICE_ACCOUNT
  value: {{ include "rbak.sparkServiceAccountName" . | quote }}
{{- end }}
{{- if .Values.metrics.enabled }}
- name: RBAK_METRICS_PORT
  value: {{ .Values.metrics.port | quote }}
{{- end }}
- name: RBAK_LOG_LEVEL
  value: {{ .Values.operator.logLevel | quote }}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
{{- end -}}

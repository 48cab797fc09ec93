{{/*
The operator's permissions. Keep equal to what operator/rbak_operator uses:
tests/ship/test_rbac.py fails on any difference, in either direction.
*/}}

{{/* Cluster-scoped: what kopf needs to start (CRD discovery, namespace scanning). */}}
{{- define "rbak.operatorClusterRules" -}}
- apiGroups: [""]
  resources: [namespaces]
  verbs: [list, watch]
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [list, watch]
{{- end -}}

{{/* Per watched namespace (or cluster-wide when watching all): operator/rbak_operator/kube/api_calls.py. */}}
{{- define "rbak.operatorNamespacedRules" -}}
- apiGroups: [rbak.io]
  resources: [rabbitmqbackups, rabbitmqrestores, rabbitmqarchives]
  verbs: [get, list, watch, patch]
- apiGroups: [rbak.io]
  resources: [rabbitmqbackups/status, rabbitmqrestores/status, rabbitmqarchives/status]
  verbs: [get, patch]
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, create, update, delete]
- apiGroups: [batch]
  resources: [jobs]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [""]
  resources: [pods]
  verbs: [list]
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, create, update, delete]
- apiGroups: [""]
  resources: [secrets]
  verbs: [get]
- apiGroups: [""]
  resources: [events]
  verbs: [create]
- apiGroups: [sparkoperator.k8s.io]
  resources: [sparkapplications]
  verbs: [get, list, watch, create, delete]
- apiGroups: [rabbitmq.com]
  resources: [rabbitmqclusters]
  verbs: [get]
{{- end -}}

{{/* Leader election (release namespace only): the operator creates its Lease on
first start, reads it and renews it. */}}
{{- define "rbak.operatorLeaseRules" -}}
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  verbs: [get, create, update]
{{- end -}}

{{/* Spark driver pods (spark-on-kubernetes): executors, their service, config maps. */}}
{{- define "rbak.sparkDriverRules" -}}
- apiGroups: [""]
  resources: [pods, services, configmaps, persistentvolumeclaims]
  verbs: [get, list, watch, create, delete, deletecollection, patch]
{{- end -}}

{{/* Operator configuration: environment read by operator/rbak_operator
(tests/ship checks every name here is read there). */}}
{{- define "rbak.operatorEnv" -}}
- name: RBAK_IMAGE
  value: {{ include "rbak.image" . | quote }}
- name: RBAK_SPARK_IMAGE
  value: {{ include "rbak.sparkImage" . | quote }}
- name: RBAK_OPERATOR_NAMESPACES
  value: {{ join "," .Values.watchNamespaces | quote }}
{{- if include "rbak.leaderElectionEnabled" . }}
- name: RBAK_LEASE_NAME
  value: {{ include "rbak.leaseName" . | quote }}
- name: RBAK_LEASE_NAMESPACE
  value: {{ .Release.Namespace | quote }}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
{{- else }}
- name: RBAK_OPERATOR_STANDALONE
  value: "1"
{{- end }}
- name: RBAK_OPERATOR_LIVENESS
  value: {{ printf "http://0.0.0.0:%d/healthz" (int .Values.operator.healthPort) | quote }}
- name: RBAK_METRICS_PORT
  value: {{ ternary .Values.metrics.port 0 .Values.metrics.enabled | quote }}
- name: RBAK_OPERATOR_RESYNC_SECONDS
  value: {{ .Values.operator.resyncSeconds | quote }}
- name: RBAK_OPERATOR_EVIDENCE_RECHECK_SECONDS
  value: {{ .Values.operator.evidenceRecheckSeconds | quote }}
- name: RBAK_OPERATOR_START_TIMEOUT_SECONDS
  value: {{ .Values.operator.runStartTimeoutSeconds | quote }}
{{- if .Values.operator.backupClaims }}
- name: RBAK_OPERATOR_PVC_ROOT
  value: /var/lib/rbak-operator/pvc
{{- end }}
- name: RBAK_OPERATOR_LOG_LEVEL
  value: {{ upper .Values.operator.logLevel | quote }}
{{- end -}}

{{/* Names, labels and images shared by every template. */}}

{{- define "rbak.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "rbak.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "rbak.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "rbak.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: rbak
{{- end -}}

{{- define "rbak.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rbak.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "rbak.operatorSelectorLabels" -}}
{{ include "rbak.selectorLabels" . }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "rbak.operatorServiceAccountName" -}}
{{- default (printf "%s-operator" (include "rbak.fullname" .)) .Values.serviceAccount.operator.name -}}
{{- end -}}

{{- define "rbak.jobServiceAccountName" -}}
{{- default (printf "%s-job" (include "rbak.fullname" .)) .Values.serviceAccount.backupJob.name -}}
{{- end -}}

{{- define "rbak.sparkServiceAccountName" -}}
{{- default (printf "%s-spark" (include "rbak.fullname" .)) .Values.spark.serviceAccount.name -}}
{{- end -}}

{{/* repository:tag or repository@digest */}}
{{- define "rbak.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* the Dockerfile's "spark" target: same repository, tag + suffix (never a digest + suffix) */}}
{{- define "rbak.sparkImage" -}}
{{- if .Values.spark.image -}}
{{- .Values.spark.image -}}
{{- else -}}
{{- printf "%s:%s%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) .Values.spark.tagSuffix -}}
{{- end -}}
{{- end -}}

{{/* Leader election on a Lease: with more than one replica, or when asked for. */}}
{{- define "rbak.leaderElectionEnabled" -}}
{{- if or .Values.operator.leaderElection.enabled (gt (int .Values.operator.replicas) 1) -}}true{{- end -}}
{{- end -}}

{{- define "rbak.leaseName" -}}
{{- default (include "rbak.fullname" .) .Values.operator.leaderElection.leaseName -}}
{{- end -}}

{{/* Chart name, truncated to the 63 characters of a DNS label. */}}
{{- define "jobscope.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: release-chart unless the release name already holds the chart name. */}}
{{- define "jobscope.fullname" -}}
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

{{/* chart-version label value. */}}
{{- define "jobscope.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Selector labels of a component; call with (dict "ctx" $ "component" "api"). */}}
{{- define "jobscope.selectorLabels" -}}
app.kubernetes.io/name: {{ include "jobscope.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* Every label of a component's resources; same argument as jobscope.selectorLabels. */}}
{{- define "jobscope.labels" -}}
helm.sh/chart: {{ include "jobscope.chart" .ctx }}
{{ include "jobscope.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: jobscope
{{- with .ctx.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Image reference of a component; call with (dict "ctx" $ "image" .Values.api.image). */}}
{{- define "jobscope.image" -}}
{{- $tag := default .ctx.Chart.AppVersion .ctx.Values.image.tag }}
{{- if .ctx.Values.image.registry }}
{{- printf "%s/%s:%s" .ctx.Values.image.registry .image.repository $tag }}
{{- else }}
{{- printf "%s:%s" .image.repository $tag }}
{{- end }}
{{- end }}

{{/* ServiceAccount name of the pods. */}}
{{- define "jobscope.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "jobscope.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* What every pod of the release shares: the ServiceAccount (its token not mounted), the
image pull Secrets, the pod security context. */}}
{{- define "jobscope.podDefaults" -}}
serviceAccountName: {{ include "jobscope.serviceAccountName" . }}
automountServiceAccountToken: false
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- end }}

{{/* Name of the chart's Secret of credentials (when no existing Secret is given). */}}
{{- define "jobscope.credentialsSecret" -}}
{{- printf "%s-credentials" (include "jobscope.fullname" .) }}
{{- end }}

{{/* Secret and key of the ClickHouse admin password. */}}
{{- define "jobscope.clickhouseAdminPasswordRef" -}}
{{- if .Values.clickhouse.admin.existingSecret }}
name: {{ .Values.clickhouse.admin.existingSecret }}
key: {{ .Values.clickhouse.admin.existingSecretKey }}
{{- else }}
name: {{ include "jobscope.credentialsSecret" . }}
key: clickhouseAdminPassword
{{- end }}
{{- end }}

{{/* Secret and key of the API's ClickHouse password. */}}
{{- define "jobscope.clickhouseApiPasswordRef" -}}
{{- if .Values.clickhouse.api.existingSecret }}
name: {{ .Values.clickhouse.api.existingSecret }}
key: {{ .Values.clickhouse.api.existingSecretKey }}
{{- else }}
name: {{ include "jobscope.credentialsSecret" . }}
key: clickhouseApiPassword
{{- end }}
{{- end }}

{{/* Name of the Secret of the API tokens. */}}
{{- define "jobscope.tokensSecret" -}}
{{- default (include "jobscope.credentialsSecret" .) .Values.api.tokens.existingSecret }}
{{- end }}

{{/* Where Kafka is (every jobscope process). */}}
{{- define "jobscope.kafkaEnv" -}}
- name: JOBSCOPE_KAFKA_BOOTSTRAP
  value: {{ .Values.kafka.bootstrapServers | quote }}
{{- end }}

{{/* How one component logs in to Kafka (kafka/security.py): (dict "ctx" . "user" "api"),
the user a key of kafka.security.users; nothing with PLAINTEXT. */}}
{{- define "jobscope.kafkaSecurityEnv" -}}
{{- $security := .ctx.Values.kafka.security }}
{{- if ne $security.protocol "PLAINTEXT" }}
{{- $user := index $security.users .user }}
- name: JOBSCOPE_KAFKA_SECURITY_PROTOCOL
  value: {{ $security.protocol | quote }}
- name: JOBSCOPE_KAFKA_SASL_MECHANISM
  value: {{ $security.saslMechanism | quote }}
- name: JOBSCOPE_KAFKA_SASL_USERNAME
  value: {{ $user.username | quote }}
- name: JOBSCOPE_KAFKA_SASL_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ required "kafka.security.existingSecret is required with SASL" $security.existingSecret }}
      key: {{ $user.passwordKey }}
{{- if $security.caSecret }}
- name: JOBSCOPE_KAFKA_SSL_CA_FILE
  value: /etc/jobscope/kafka-ca/{{ $security.caSecretKey }}
{{- end }}
{{- end }}
{{- end }}

{{/* The mount of the Kafka CA (kafka.security.caSecret), for a container's volumeMounts. */}}
{{- define "jobscope.kafkaCaMount" -}}
{{- if .Values.kafka.security.caSecret }}
- name: kafka-ca
  mountPath: /etc/jobscope/kafka-ca
  readOnly: true
{{- end }}
{{- end }}

{{/* The volume of the Kafka CA, for a pod's volumes. */}}
{{- define "jobscope.kafkaCaVolume" -}}
{{- if .Values.kafka.security.caSecret }}
- name: kafka-ca
  secret:
    secretName: {{ .Values.kafka.security.caSecret }}
{{- end }}
{{- end }}

{{/* The opt-in JSON copy of the readings (the processes that write readings). */}}
{{- define "jobscope.jsonTopicEnv" -}}
- name: JOBSCOPE_JSON_TOPIC
  value: {{ .Values.kafka.jsonTopic | quote }}
{{- end }}

{{/* Where ClickHouse is (the API, the schema Job, Superset). */}}
{{- define "jobscope.clickhouseEnv" -}}
- name: JOBSCOPE_CLICKHOUSE_HOST
  value: {{ .Values.clickhouse.host | quote }}
- name: JOBSCOPE_CLICKHOUSE_PORT
  value: {{ .Values.clickhouse.port | quote }}
- name: JOBSCOPE_CLICKHOUSE_DATABASE
  value: {{ .Values.clickhouse.database | quote }}
{{- end }}

{{/* Name of the ConfigMap or Secret of the devices files, and which of the two it is. */}}
{{- define "jobscope.devicesVolume" -}}
{{- if .Values.producers.existingSecret }}
secret:
  secretName: {{ .Values.producers.existingSecret }}
{{- else }}
configMap:
  name: {{ default (printf "%s-devices" (include "jobscope.fullname" .)) .Values.producers.existingConfigMap }}
{{- end }}
{{- end }}

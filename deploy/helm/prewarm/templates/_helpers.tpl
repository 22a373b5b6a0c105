{{/* Names and labels. */}}
{{- define "prewarm.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "prewarm.labels" -}}
app.kubernetes.io/name: prewarm
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Selector labels of one component: (list $ "web"). */}}
{{- define "prewarm.selector" -}}
{{- $ := index . 0 -}}
app.kubernetes.io/name: prewarm
app.kubernetes.io/instance: {{ $.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "prewarm.image" -}}
{{- $ := index . 0 -}}
{{- $img := index $.Values.image (index . 1) -}}
{{- printf "%s:%s" $img.repository ($img.tag | default $.Chart.AppVersion) -}}
{{- end -}}

{{- define "prewarm.webUrl" -}}
{{- printf "http://%s-web.%s.svc:%v" (include "prewarm.fullname" .) .Release.Namespace .Values.web.service.port -}}
{{- end -}}

{{/*
The live Secret of this release, as JSON ({} when there is none: a first install, or an offline
render). It is the chart's one lookup: generated secrets are read back from it on upgrade.
*/}}
{{- define "prewarm.existingSecret" -}}
{{- lookup "v1" "Secret" .Release.Namespace (include "prewarm.fullname" .) | toJson -}}
{{- end -}}

{{/*
The release's secrets: an explicit value, else the one the live Secret holds, else a new random
one. Random: include it once per render (secret.yaml does) and pass the result on.
*/}}
{{- define "prewarm.secrets" -}}
{{- $live := include "prewarm.existingSecret" . | fromJson -}}
{{- $data := (get $live "data") | default dict -}}
{{- $s := dict -}}
{{- $_ := set $s "SECRET_KEY" (.Values.controlplane.secretKey | default ((get $data "SECRET_KEY") | default "" | b64dec) | default (randAlphaNum 64)) -}}
{{- $_ := set $s "FLEET_ENROLMENT_TOKEN" (.Values.agent.enrolment.token | default ((get $data "FLEET_ENROLMENT_TOKEN") | default "" | b64dec) | default (printf "pwe_%s" (randAlphaNum 43))) -}}
{{- $_ := set $s "POSTGRES_PASSWORD" (.Values.postgresql.password | default ((get $data "POSTGRES_PASSWORD") | default "" | b64dec) | default (randAlphaNum 32)) -}}
{{- toJson $s -}}
{{- end -}}

{{/* DATABASE_URL: (list $ $postgresPassword). */}}
{{- define "prewarm.databaseUrl" -}}
{{- $password := index . 1 -}}
{{- with index . 0 -}}
{{- if .Values.postgresql.enabled -}}
{{- printf "postgres://%s:%s@%s-postgresql:5432/%s" .Values.postgresql.user $password (include "prewarm.fullname" .) .Values.postgresql.database -}}
{{- else -}}
{{- required "database.url (DATABASE_URL) is required, or postgresql.enabled for a trial" .Values.database.url -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "prewarm.redisUrl" -}}
{{- if .Values.redisServer.enabled -}}
{{- printf "redis://%s-redis:6379/0" (include "prewarm.fullname" .) -}}
{{- else -}}
{{- required "redis.url (REDIS_URL) is required, or redisServer.enabled for a trial" .Values.redis.url -}}
{{- end -}}
{{- end -}}

{{/*
Migrations run before the release's pods change (pre-install, pre-upgrade). With the trial
PostgreSQL, which the release itself creates, the first run waits until after install.
*/}}
{{- define "prewarm.migrateHooks" -}}
{{- if .Values.postgresql.enabled -}}post-install,pre-upgrade{{- else -}}pre-install,pre-upgrade{{- end -}}
{{- end -}}

{{/* The environment of every control-plane container (controlplane/settings/). */}}
{{- define "prewarm.controlplaneEnv" -}}
{{- $secret := include "prewarm.fullname" . -}}
- name: POD_IP
  valueFrom: {fieldRef: {fieldPath: status.podIP}}
- name: SECRET_KEY
  valueFrom: {secretKeyRef: {name: {{ $secret }}, key: SECRET_KEY}}
- name: DATABASE_URL
  valueFrom: {secretKeyRef: {name: {{ $secret }}, key: DATABASE_URL}}
- name: REDIS_URL
  valueFrom: {secretKeyRef: {name: {{ $secret }}, key: REDIS_URL}}
- name: ALLOWED_HOSTS
  value: {{ concat .Values.controlplane.allowedHosts (list (printf "%s-web" $secret) (printf "%s-web.%s.svc" $secret .Release.Namespace) "$(POD_IP)") | join "," | quote }}
- name: CSRF_TRUSTED_ORIGINS
  value: {{ .Values.controlplane.csrfTrustedOrigins | join "," | quote }}
- name: PREWARM_SECURE
  value: {{ .Values.controlplane.secure | toString | quote }}
- name: SECURE_SSL_REDIRECT
  value: {{ .Values.controlplane.sslRedirect | toString | quote }}
- name: PREWARM_TRUSTED_PROXY_COUNT
  value: {{ .Values.controlplane.trustedProxyCount | toString | quote }}
{{- range $name, $value := .Values.controlplane.env }}
- name: {{ $name }}
  value: {{ $value | toString | quote }}
{{- end }}
{{- end -}}

{{/* Writable places under a read-only root: the data folder and /tmp. */}}
{{- define "prewarm.controlplaneMounts" -}}
- {name: data, mountPath: /var/lib/prewarm}
- {name: tmp, mountPath: /tmp}
{{- end -}}
{{- define "prewarm.controlplaneVolumes" -}}
- {name: data, emptyDir: {}}
- {name: tmp, emptyDir: {}}
{{- end -}}

{{/* manage.py migrate, in the hook Job. */}}
{{- define "prewarm.migrateContainer" -}}
- name: migrate
  image: {{ include "prewarm.image" (list . "controlplane") }}
  imagePullPolicy: {{ .Values.image.controlplane.pullPolicy }}
  command: ["python", "manage.py", "migrate", "--noinput"]
  env: {{- include "prewarm.controlplaneEnv" . | nindent 4 }}
  securityContext: {{- toYaml .Values.controlplane.securityContext | nindent 4 }}
  resources: {{- toYaml .Values.migrations.resources | nindent 4 }}
  volumeMounts: {{- include "prewarm.controlplaneMounts" . | nindent 4 }}
{{- end -}}

{{/* The pod spec's common part for control-plane pods. */}}
{{- define "prewarm.controlplanePod" -}}
automountServiceAccountToken: false
securityContext: {{- toYaml .Values.controlplane.podSecurityContext | nindent 2 }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets: {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The agent's environment, shared by the DaemonSet and the sidecar. */}}
{{- define "prewarm.agentEnv" -}}
- name: PREWARM_AGENT_CONTROL_PLANE_URL
  value: {{ .Values.agent.controlPlaneUrl | default (include "prewarm.webUrl" .) | quote }}
- name: PREWARM_AGENT_ENROLMENT_TOKEN
  valueFrom: {secretKeyRef: {name: {{ include "prewarm.fullname" . }}-agent, key: enrolment-token}}
- name: PREWARM_AGENT_STATE_DIR
  value: /var/lib/prewarm-agent
- name: PREWARM_AGENT_TAP_TENANT
  value: {{ .Values.agent.tapTenant | quote }}
- name: NVIDIA_DRIVER_CAPABILITIES
  value: utility
{{- range $name, $value := .Values.agent.env }}
- name: {{ $name }}
  value: {{ $value | toString | quote }}
{{- end }}
{{- end -}}

{{- define "prewarm.agentEnabled" -}}
{{- if or .Values.agent.daemonset.enabled .Values.agent.sidecar.enabled -}}true{{- end -}}
{{- end -}}

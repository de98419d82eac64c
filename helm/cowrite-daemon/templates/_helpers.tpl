{{/*
Names, labels and the daemon's container, shared by every template of this chart and, in sidecar
mode, by the charts that embed the daemon in their own pods. Templates named "sidecar*" are the public
interface for those charts (see README.md); the others may change between chart versions.
*/}}

{{/* Chart name, or nameOverride. */}}
{{- define "cowrite-daemon.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name of the release's resources: fullnameOverride, else "<release>-<name>", else the release name
alone when it already contains the name. Truncated to 63 characters, the DNS label limit.
*/}}
{{- define "cowrite-daemon.fullname" -}}
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

{{/* "<chart>-<version>" for the helm.sh/chart label ("+" is not allowed in label values). */}}
{{- define "cowrite-daemon.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels that select the daemon's pods; never change them, a Deployment's selector is immutable. */}}
{{- define "cowrite-daemon.selectorLabels" -}}
app.kubernetes.io/name: {{ include "cowrite-daemon.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Labels on every resource. */}}
{{- define "cowrite-daemon.labels" -}}
helm.sh/chart: {{ include "cowrite-daemon.chart" . }}
{{ include "cowrite-daemon.selectorLabels" . }}
app.kubernetes.io/component: daemon
{{- with .Chart.AppVersion }}
app.kubernetes.io/version: {{ . | quote }}
{{- end }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The ServiceAccount the Deployment runs as. */}}
{{- define "cowrite-daemon.serviceAccountName" -}}
{{- if .Values.serviceAccount.enabled }}
{{- default (include "cowrite-daemon.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Image reference; the tag defaults to the chart's appVersion. */}}
{{- define "cowrite-daemon.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/* Where the ConfigMap is mounted; the daemon is started with --config <dir>/daemon.toml. */}}
{{- define "cowrite-daemon.configDir" -}}
/etc/cowrite
{{- end }}

{{/* Stops the release early on value combinations the schema cannot explain well. */}}
{{- define "cowrite-daemon.validate" -}}
{{- if and .Values.serviceMonitor.enabled (ne .Values.mode "service") }}
{{- fail "serviceMonitor.enabled needs mode=service: a sidecar has no Service to monitor; use podMonitor.enabled instead" }}
{{- end }}
{{- if and .Values.podMonitor.enabled (ne .Values.mode "sidecar") }}
{{- fail "podMonitor.enabled needs mode=sidecar: in service mode use serviceMonitor.enabled" }}
{{- end }}
{{- if and .Values.scrapeAnnotations.enabled (eq .Values.scrapeAnnotations.target "service") (ne .Values.mode "service") }}
{{- fail "scrapeAnnotations.target=service needs mode=service: a sidecar has no Service; use target=pod" }}
{{- end }}
{{- end }}

{{/*
daemon.toml. Strings and numbers are written with toJson: a JSON string or number is also a valid
TOML basic string or number. extraConfig comes first so that top-level keys in it stay top-level
instead of landing in the last [[tables]] entry.
*/}}
{{- define "cowrite-daemon.daemonToml" -}}
# Rendered by the cowrite-daemon Helm chart from its values; edit the values, not this file.
{{- with .Values.extraConfig }}

{{ trim . }}
{{- end }}

[server]
host = {{ .Values.server.host | toJson }}
port = {{ .Values.server.port | int }}

[follow]
poll_interval_seconds = {{ .Values.follow.pollIntervalSeconds | toJson }}

[cleaner]
interval_seconds = {{ .Values.cleaner.intervalSeconds | toJson }}
commits_retained = {{ .Values.cleaner.commitsRetained | int }}

[overlay]
snapshot_every = {{ .Values.overlay.snapshotEvery | int }}
{{- range .Values.tables }}

[[tables]]
{{- if kindIs "string" . }}
uri = {{ . | toJson }}
{{- else }}
uri = {{ .uri | toJson }}
{{- range $key, $value := omit . "uri" }}
{{ $key }} = {{ $value | toJson }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* prometheus.io/* annotations for annotation-based scraping. */}}
{{- define "cowrite-daemon.scrapeAnnotations" -}}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .Values.server.port | int | quote }}
prometheus.io/path: /metrics
{{- end }}

{{/* One httpGet probe on the named port. Takes (dict "probe" <probe values> "port" <port name>). */}}
{{- define "cowrite-daemon.probe" -}}
httpGet:
  path: {{ .probe.path }}
  port: {{ .port }}
periodSeconds: {{ .probe.periodSeconds }}
timeoutSeconds: {{ .probe.timeoutSeconds }}
failureThreshold: {{ .probe.failureThreshold }}
{{- end }}

{{/*
The daemon container as a one-item YAML list. Takes (dict "ctx" <root context> "sidecar" <bool>): a
sidecar names its port sidecar.portName, since its host container probably has an "http" port, and is
a native sidecar (restartPolicy: Always) when sidecar.native is set.
*/}}
{{- define "cowrite-daemon.container" -}}
{{- $ctx := .ctx }}
{{- $values := .ctx.Values }}
{{- $port := ternary $values.sidecar.portName "http" .sidecar -}}
- name: cowrite-daemon
  image: {{ include "cowrite-daemon.image" $ctx | quote }}
  imagePullPolicy: {{ $values.image.pullPolicy }}
  {{- if and .sidecar $values.sidecar.native }}
  restartPolicy: Always
  {{- end }}
  args:
    - daemon
    - --config
    - {{ include "cowrite-daemon.configDir" $ctx }}/daemon.toml
  ports:
    - name: {{ $port }}
      containerPort: {{ $values.server.port | int }}
      protocol: TCP
  {{- if or $values.auth.enabled $values.env }}
  env:
    {{- if $values.auth.enabled }}
    - name: COWRITE_DAEMON_TOKEN
      valueFrom:
        secretKeyRef:
          name: {{ $values.auth.existingSecret }}
          key: {{ $values.auth.secretKey }}
    {{- end }}
    {{- with $values.env }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- end }}
  {{- with $values.envFrom }}
  envFrom:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- if $values.startupProbe.enabled }}
  startupProbe:
    {{- include "cowrite-daemon.probe" (dict "probe" $values.startupProbe "port" $port) | nindent 4 }}
  {{- end }}
  {{- if $values.livenessProbe.enabled }}
  livenessProbe:
    {{- include "cowrite-daemon.probe" (dict "probe" $values.livenessProbe "port" $port) | nindent 4 }}
  {{- end }}
  {{- if $values.readinessProbe.enabled }}
  readinessProbe:
    {{- include "cowrite-daemon.probe" (dict "probe" $values.readinessProbe "port" $port) | nindent 4 }}
  {{- end }}
  {{- with $values.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $values.securityContext }}
  securityContext:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  volumeMounts:
    - name: cowrite-config
      mountPath: {{ include "cowrite-daemon.configDir" $ctx }}
      readOnly: true
    - name: cowrite-tmp
      mountPath: /tmp
    {{- with $values.extraVolumeMounts }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end }}

{{/* The volumes the container mounts, as YAML list items. */}}
{{- define "cowrite-daemon.volumes" -}}
- name: cowrite-config
  configMap:
    name: {{ include "cowrite-daemon.fullname" . }}
- name: cowrite-tmp
  emptyDir:
    {{- with .Values.tmpDir.sizeLimit }}
    sizeLimit: {{ . }}
    {{- else }} {}
    {{- end }}
{{- end }}

{{/* Pod annotations: a checksum of daemon.toml, so a config change rolls the pods, and scraping. */}}
{{- define "cowrite-daemon.podAnnotations" -}}
checksum/cowrite-config: {{ include "cowrite-daemon.daemonToml" . | sha256sum }}
{{- if and .Values.scrapeAnnotations.enabled (or (eq .Values.mode "sidecar") (eq .Values.scrapeAnnotations.target "pod")) }}
{{ include "cowrite-daemon.scrapeAnnotations" . }}
{{- end }}
{{- end }}

{{- define "cowrite-daemon.requireSidecarMode" -}}
{{- if ne .Values.mode "sidecar" }}
{{- fail "the cowrite-daemon.sidecar* templates need the daemon chart's mode=sidecar, or it also deploys its own Deployment" }}
{{- end }}
{{- end }}

{{/*
Public: the daemon as a sidecar container, a one-item YAML list to append to a pod's containers (or
initContainers when sidecar.native is true). Call it with the daemon chart's own context; from a
parent chart that is (index .Subcharts "cowrite-daemon"):

  containers:
    - name: my-writer
      ...
    {{- include "cowrite-daemon.sidecarContainer" (index .Subcharts "cowrite-daemon") | nindent 4 }}
*/}}
{{- define "cowrite-daemon.sidecarContainer" -}}
{{- include "cowrite-daemon.requireSidecarMode" . }}
{{- include "cowrite-daemon.container" (dict "ctx" . "sidecar" true) }}
{{- end }}

{{/* Public: the sidecar's volumes (its config and /tmp), YAML list items for the pod's volumes. */}}
{{- define "cowrite-daemon.sidecarVolumes" -}}
{{- include "cowrite-daemon.requireSidecarMode" . }}
{{- include "cowrite-daemon.volumes" . }}
{{- end }}

{{/* Public: annotations for the host pod template (config checksum; scrape annotations if enabled). */}}
{{- define "cowrite-daemon.sidecarPodAnnotations" -}}
{{- include "cowrite-daemon.requireSidecarMode" . }}
{{- include "cowrite-daemon.podAnnotations" . }}
{{- end }}

{{/*
A strategic-merge patch that adds the sidecar to a Deployment, StatefulSet or DaemonSet: containers,
initContainers and volumes merge by name, so the host's own entries are kept.
*/}}
{{- define "cowrite-daemon.sidecarPatch" -}}
spec:
  template:
    metadata:
      annotations:
        {{- include "cowrite-daemon.sidecarPodAnnotations" . | nindent 8 }}
    spec:
      {{- if .Values.sidecar.native }}
      initContainers:
      {{- else }}
      containers:
      {{- end }}
        {{- include "cowrite-daemon.sidecarContainer" . | nindent 8 }}
      volumes:
        {{- include "cowrite-daemon.sidecarVolumes" . | nindent 8 }}
{{- end }}

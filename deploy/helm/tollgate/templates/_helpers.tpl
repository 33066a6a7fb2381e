{{/* The chart's name, cut to a DNS label. */}}
{{- define "tollgate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's object name: the release name, with the chart's name
added unless the release name holds it already. */}}
{{- define "tollgate.fullname" -}}
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

{{/* The release's labels; the gateway's and Redis' pods add their
component, so that neither's selector picks the other's pods. */}}
{{- define "tollgate.releaseLabels" -}}
app.kubernetes.io/name: {{ include "tollgate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "tollgate.selectorLabels" -}}
{{ include "tollgate.releaseLabels" . }}
app.kubernetes.io/component: gateway
{{- end }}

{{- define "tollgate.redisSelectorLabels" -}}
{{ include "tollgate.releaseLabels" . }}
app.kubernetes.io/component: redis
{{- end }}

{{- define "tollgate.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "tollgate.releaseLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* tollgate.buildConfig fills .out with gateway.toml's tables: the
values' config, and what the chart decides: [server] listen (the container
port), watch_config (true unless set), and [redis] addrs when the chart runs
Redis. It fails when config sets what the chart owns. */}}
{{- define "tollgate.buildConfig" -}}
{{- $ctx := .ctx }}
{{- $out := .out }}
{{- range $k, $v := deepCopy ($ctx.Values.config | default dict) }}
{{- $_ := set $out $k $v }}
{{- end }}
{{- $server := get $out "server" | default dict }}
{{- if hasKey $server "listen" }}
{{- fail "config.server.listen is set by the chart (containerPort): remove it" }}
{{- end }}
{{- $_ := set $server "listen" (printf ":%d" (int $ctx.Values.containerPort)) }}
{{- if not (hasKey $server "watch_config") }}
{{- $_ := set $server "watch_config" true }}
{{- end }}
{{- $_ := set $out "server" $server }}
{{- if $ctx.Values.redis.enabled }}
{{- $redis := get $out "redis" | default dict }}
{{- if hasKey $redis "addrs" }}
{{- fail "config.redis.addrs is set with redis.enabled: use one Redis, the chart's or yours" }}
{{- end }}
{{- $_ := set $redis "addrs" (list (printf "%s-redis:6379" (include "tollgate.fullname" $ctx))) }}
{{- $_ := set $out "redis" $redis }}
{{- end }}
{{- include "tollgate.wholeNumbersToInts" $out }}
{{- end }}

{{/* tollgate.wholeNumbersToInts turns every whole number in the map, its
maps and its lists into an integer, in place. Helm reads every number of a
values file as a float, which toToml writes as 30.0, and the gateway takes
no float for an integer key (max_event_bytes, requests, ...); an integer
is taken for a float key. */}}
{{- define "tollgate.wholeNumbersToInts" -}}
{{- $m := . }}
{{- range $k, $v := $m }}
{{- if kindIs "map" $v }}
{{- include "tollgate.wholeNumbersToInts" $v }}
{{- else if kindIs "slice" $v }}
{{- $l := list }}
{{- range $e := $v }}
{{- if kindIs "map" $e }}
{{- include "tollgate.wholeNumbersToInts" $e }}
{{- $l = append $l $e }}
{{- else if and (kindIs "float64" $e) (eq $e (floor $e)) }}
{{- $l = append $l (int64 $e) }}
{{- else }}
{{- $l = append $l $e }}
{{- end }}
{{- end }}
{{- $_ := set $m $k $l }}
{{- else if and (kindIs "float64" $v) (eq $v (floor $v)) }}
{{- $_ := set $m $k (int64 $v) }}
{{- end }}
{{- end }}
{{- end }}

{{/* tollgate.configToml is the rendered gateway.toml. */}}
{{- define "tollgate.configToml" -}}
{{- $cfg := dict }}
{{- include "tollgate.buildConfig" (dict "ctx" . "out" $cfg) }}
{{- toToml $cfg }}
{{- end }}

{{/* tollgate.restartConfigSum is a checksum of the keys of gateway.toml
that a reload refuses (docs/operations.md): a change to one of them rolls
the pods, a change to the others is reloaded in place. */}}
{{- define "tollgate.restartConfigSum" -}}
{{- $cfg := dict }}
{{- include "tollgate.buildConfig" (dict "ctx" . "out" $cfg) }}
{{- $cfg = omit $cfg "keys" "teams" "models" "routes" "upstreams" "slo" "probe" }}
{{- if hasKey $cfg "log" }}
{{- $_ := set $cfg "log" (omit $cfg.log "level") }}
{{- end }}
{{- if hasKey $cfg "ratelimit" }}
{{- $_ := set $cfg "ratelimit" (omit $cfg.ratelimit "default_max_tokens") }}
{{- end }}
{{- toToml $cfg | sha256sum }}
{{- end }}

{{/* tollgate.terminationGrace is terminationGracePeriodSeconds: the
preStop sleep, then the gateway's shutdown delay and drain, then what it
does after the drain (shutdown.afterDrainSeconds), rounded up to a whole
second. The delay's and drain's defaults are the gateway's (0 and 30). */}}
{{- define "tollgate.terminationGrace" -}}
{{- $server := .Values.config.server | default dict }}
{{- $delay := float64 (dig "shutdown_delay_seconds" 0 $server) }}
{{- $drain := float64 (dig "drain_timeout_seconds" 30 $server) }}
{{- $total := addf .Values.shutdown.preStopSleepSeconds $delay $drain .Values.shutdown.afterDrainSeconds }}
{{- ceil $total | int }}
{{- end }}

{{/* tollgate.memoryBytes is a Kubernetes memory quantity in bytes, for
the suffixes people use for memory (none, k, M, G, T, Ki, Mi, Gi, Ti). */}}
{{- define "tollgate.memoryBytes" -}}
{{- $q := toString . }}
{{- $units := dict "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776 "k" 1000 "M" 1000000 "G" 1000000000 "T" 1000000000000 }}
{{- $n := regexFind "^[0-9]+" $q }}
{{- $suffix := trimPrefix $n $q }}
{{- if or (not $n) (and $suffix (not (hasKey $units $suffix))) }}
{{- fail (printf "resources.limits.memory %q: write it as a whole number of bytes, Ki, Mi, Gi or Ti" $q) }}
{{- end }}
{{- mul (int64 $n) (get $units $suffix | default 1 | int64) }}
{{- end }}

{{/* tollgate.goMemLimit is GOMEMLIMIT in bytes: goMemLimitPercent of the
memory limit; empty without a limit or with the percentage 0. */}}
{{- define "tollgate.goMemLimit" -}}
{{- $limit := dig "limits" "memory" "" (.Values.resources | default dict) }}
{{- if and $limit .Values.goMemLimitPercent }}
{{- div (mul (include "tollgate.memoryBytes" $limit | int64) (int64 .Values.goMemLimitPercent)) 100 }}
{{- end }}
{{- end }}

{{/*
Labels of every object: the kustomize package's app.kubernetes.io/part-of, and Helm's own.
*/}}
{{- define "gpupool.labels" -}}
app.kubernetes.io/part-of: gpupool
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{/* gpupool's image: the tag defaults to the chart's appVersion. */}}
{{- define "gpupool.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/*
The webhooks' caBundle: the value, else (certificates from the bootstrap Job) ca.crt of the Secret
the Job wrote, read at install or upgrade; "" when neither is known.
*/}}
{{- define "gpupool.caBundle" -}}
{{- if .Values.webhooks.caBundle -}}
{{ .Values.webhooks.caBundle }}
{{- else if eq .Values.certificates.source "bootstrap" -}}
{{- $secret := lookup "v1" "Secret" "gpupool-system" "gpupool-extender-tls" -}}
{{- if and $secret $secret.data -}}
{{ index $secret.data "ca.crt" | default "" }}
{{- end -}}
{{- end -}}
{{- end }}

{{/*
The webhooks' caBundle comes from cert-manager's injector, the value, the admin (source none), or
the certificate Job, which writes its CA into both configurations right after making it
(`gpupool certs bootstrap --webhook`); until that Job has run (seconds after the first install) a
webhook refuses what it covers (failurePolicy Fail). Upgrades render the CA the Job left (lookup).
*/}}

{{/* The webhooks' cert-manager annotation. */}}
{{- define "gpupool.webhookAnnotations" -}}
{{- if eq .Values.certificates.source "cert-manager" }}
annotations:
  cert-manager.io/inject-ca-from: gpupool-system/gpupool-extender
{{- end }}
{{- end }}

{{/* A webhook's clientConfig.caBundle line, when the CA is known. */}}
{{- define "gpupool.caBundleField" -}}
{{- with include "gpupool.caBundle" . }}
caBundle: {{ . }}
{{- end }}
{{- end }}

{{/* The resources the extender manages (managedResources, the pod-scheduler webhook's list). */}}
{{- define "gpupool.managedResources" -}}
{{- $names := list "gpupool.io/gpu" "gpupool.io/gpu-mem" "gpupool.io/gpu-core" "gpupool.io/gpu-shared" "aliyun.com/gpu-mem" "tencent.com/vcuda-core" "tencent.com/vcuda-memory" "nvidia.com/gpumem" "nvidia.com/gpucores" "nvidia.com/gpumem-percentage" "nvidia.com/priority" -}}
{{- if .Values.aliases.hamiWholeCards -}}
{{- $names = append $names "nvidia.com/gpu" -}}
{{- end -}}
{{ toJson $names }}
{{- end }}


{{/* The settings of ConfigMap gpupool-cluster the node agents read (their checksum restarts the agents). */}}
{{- define "gpupool.agentClusterSettings" -}}
resourceDomain: gpupool.io
gpushareMemoryUnit: {{ .Values.aliases.gpushareMemoryUnit }}
highPriorityThreshold: {{ .Values.cluster.highPriorityThreshold | quote }}
hami: {{ .Values.aliases.hamiWholeCards | toString | quote }}
agentLeaseNamespace: gpupool-node-lease
{{- end }}

{{/* The data of the ConfigMap gpupool-cluster: the agents' settings and the extender's rules, which
kubectl gpupool reads too (its checksum restarts the extender; a new policy rolls no agent). */}}
{{- define "gpupool.clusterSettings" -}}
{{ include "gpupool.agentClusterSettings" . }}
policy: {{ .Values.extender.policy | quote }}
requireAgentLease: {{ .Values.extender.requireAgentLease | toString | quote }}
unconfirmedTimeout: {{ .Values.extender.unconfirmedTimeout | toString | quote }}
{{- end }}

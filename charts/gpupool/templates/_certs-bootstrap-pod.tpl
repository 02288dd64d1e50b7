{{- /* The certificate Job's pod template (certs-bootstrap.yaml): rendered once there, both as the
template and, through its digest, in the Job's name. */}}
{{- define "gpupool.certsBootstrapPod" -}}
{{- $remoteGpuCa := and .Values.nodeAgent.remoteGpu.enabled .Values.nodeAgent.remoteGpu.nodeCertificates -}}
metadata:
  labels: {app: gpupool-certs}
spec:
  serviceAccountName: gpupool-certs
  {{- with $.Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  restartPolicy: OnFailure
  securityContext:
    runAsNonRoot: true
    seccompProfile: {type: RuntimeDefault}
  containers:
    - name: bootstrap
      image: {{ include "gpupool.image" . | quote }}
      {{- with $.Values.image.pullPolicy }}
      imagePullPolicy: {{ . }}
      {{- end }}
      args: ["certs", "bootstrap", "--namespace=gpupool-system", "--secret=gpupool-extender-tls",
             "--service=gpupool-extender", "--service=gpupool-extender-admission",
             "--webhook=mutating/gpupool-scheduler",
             {{- if $.Values.webhooks.claimGroups.enabled }}
             "--webhook=mutating/gpupool-claim-groups",
             {{- end }}
             "--webhook=validating/gpupool-quota", "--webhook-wait=15"]
      resources:
        requests: {cpu: 50m, memory: 64Mi}
        limits: {memory: 256Mi}
      securityContext:
        runAsNonRoot: true
        runAsUser: 65534
        allowPrivilegeEscalation: false
        readOnlyRootFilesystem: true
        capabilities: {drop: ["ALL"]}
      volumeMounts:
        - {name: tmp, mountPath: /tmp}
    {{- if $remoteGpuCa }}
    - name: remote-gpu-ca
      image: {{ include "gpupool.image" . | quote }}
      {{- with $.Values.image.pullPolicy }}
      imagePullPolicy: {{ . }}
      {{- end }}
      args: ["certs", "remote-gpu-ca", "--namespace=gpupool-system", "--secret=gpupool-remote-gpu-ca"]
      resources:
        requests: {cpu: 50m, memory: 64Mi}
        limits: {memory: 256Mi}
      securityContext:
        runAsNonRoot: true
        runAsUser: 65534
        allowPrivilegeEscalation: false
        readOnlyRootFilesystem: true
        capabilities: {drop: ["ALL"]}
      volumeMounts:
        - {name: tmp, mountPath: /tmp}
    {{- end }}
  volumes:
    - name: tmp
      emptyDir: {medium: Memory, sizeLimit: 16Mi}
{{- end }}

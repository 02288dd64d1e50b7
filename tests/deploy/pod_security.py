"""The Pod Security Standards' checks, as far as deploy/ needs them, on a rendered pod spec.

The test apiserver (v1.20) predates the PodSecurity admission, so the namespaces' labels cannot be
checked by the server; these functions apply the rules of the published standard
(kubernetes.io/docs/concepts/security/pod-security-standards) to a pod spec and return each
violation as text, so that a test can ask "would `restricted` admit this pod" and "does this pod
really need `privileged`".
"""

from __future__ import annotations

from typing import Any

#: Capabilities `baseline` lets a container add.
BASELINE_CAPABILITIES = frozenset({"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                                   "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"})
#: Volume types `restricted` allows.
RESTRICTED_VOLUMES = frozenset({"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                                "projected", "secret"})
SECCOMP_ALLOWED = frozenset({"RuntimeDefault", "Localhost"})


def _containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [*pod.get("initContainers", []), *pod.get("containers", []), *pod.get("ephemeralContainers", [])]


def baseline_violations(pod: dict[str, Any]) -> list[str]:
    """What `baseline` refuses in this pod spec."""
    found = [f"host namespace {key}" for key in ("hostNetwork", "hostPID", "hostIPC") if pod.get(key)]
    found += [f"hostPath volume {v['name']}" for v in pod.get("volumes", []) if "hostPath" in v]
    for c in _containers(pod):
        security = c.get("securityContext") or {}
        if security.get("privileged"):
            found.append(f"{c['name']}: privileged")
        added = set((security.get("capabilities") or {}).get("add", [])) - BASELINE_CAPABILITIES
        found += [f"{c['name']}: adds capability {cap}" for cap in sorted(added)]
        found += [f"{c['name']}: hostPort {p['hostPort']}" for p in c.get("ports", []) if p.get("hostPort")]
    return found


def restricted_violations(pod: dict[str, Any]) -> list[str]:
    """What `restricted` refuses in this pod spec (`baseline`'s refusals included)."""
    found = baseline_violations(pod)
    pod_security = pod.get("securityContext") or {}
    found += [f"volume {v['name']} of a type restricted forbids" for v in pod.get("volumes", [])
              if not set(v) - {"name"} <= RESTRICTED_VOLUMES]
    for c in _containers(pod):
        security = c.get("securityContext") or {}
        if security.get("allowPrivilegeEscalation") is not False:
            found.append(f"{c['name']}: allowPrivilegeEscalation is not false")
        if security.get("runAsNonRoot", pod_security.get("runAsNonRoot")) is not True:
            found.append(f"{c['name']}: runAsNonRoot is not true")
        if security.get("runAsUser", pod_security.get("runAsUser")) == 0:
            found.append(f"{c['name']}: runAsUser 0")
        seccomp = (security.get("seccompProfile") or pod_security.get("seccompProfile") or {}).get("type")
        if seccomp not in SECCOMP_ALLOWED:
            found.append(f"{c['name']}: seccompProfile {seccomp!r}, not RuntimeDefault or Localhost")
        capabilities = security.get("capabilities") or {}
        if "ALL" not in capabilities.get("drop", []):
            found.append(f"{c['name']}: does not drop ALL capabilities")
        found += [f"{c['name']}: adds {cap}" for cap in capabilities.get("add", []) if cap != "NET_BIND_SERVICE"]
    return found

"""The generated protocol modules under short names, and the protocol's constants."""

from __future__ import annotations

from gpupool.nodeagent.deviceplugin.generated import gpupool_deviceplugin_v1beta1_pb2 as pb
from gpupool.nodeagent.deviceplugin.generated import gpupool_deviceplugin_v1beta1_pb2_grpc as pb_grpc
from gpupool.nodeagent.deviceplugin.generated import gpupool_podresources_v1_pb2 as podres_pb
from gpupool.nodeagent.deviceplugin.generated import gpupool_podresources_v1_pb2_grpc as podres_grpc

__all__ = ["API_VERSION", "DEVICE_PLUGIN_DIR", "HEALTHY", "KUBELET_SOCKET", "POD_RESOURCES_SOCKET",
           "UNHEALTHY", "pb", "pb_grpc", "podres_grpc", "podres_pb"]

API_VERSION = "v1beta1"
DEVICE_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
KUBELET_SOCKET = "kubelet.sock"
POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"

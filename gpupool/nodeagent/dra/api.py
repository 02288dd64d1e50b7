"""The generated DRA and plugin-registration modules under short names, and the protocols' constants."""

from __future__ import annotations

from gpupool.api.dra import driver_name
from gpupool.nodeagent.dra.generated import gpupool_dra_v1_pb2 as dra_pb
from gpupool.nodeagent.dra.generated import gpupool_dra_v1_pb2_grpc as dra_grpc
from gpupool.nodeagent.dra.generated import gpupool_pluginregistration_v1_pb2 as reg_pb
from gpupool.nodeagent.dra.generated import gpupool_pluginregistration_v1_pb2_grpc as reg_grpc

__all__ = ["DRA_SERVICE", "KUBELET_DIR", "PLUGIN_TYPE", "REGISTRY_SUBDIR", "dra_grpc", "dra_pb", "driver_name",
           "reg_grpc", "reg_pb"]

#: The plugin type kubelet's plugin watcher hands to its DRA manager.
PLUGIN_TYPE = "DRAPlugin"
#: The gRPC service gpupool implements, as DRA plugins name it in ``supported_versions``
#: (``<proto package's last part>.<service>``; kubelet 1.34-1.37 accept it).
DRA_SERVICE = "v1.DRAPlugin"
#: kubelet's root directory; its plugin watcher scans ``<root>/plugins_registry``.
KUBELET_DIR = "/var/lib/kubelet"
REGISTRY_SUBDIR = "plugins_registry"

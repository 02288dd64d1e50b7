#!/usr/bin/env bash
# Regenerate the committed gRPC stubs of the kubelet DRA plugin (v1) and plugin registration (v1)
# protocols. Needs grpcio-tools==1.68.1 (pinned with grpcio==1.68.1 / protobuf==5.29.5 in
# pyproject.toml) so that the generated code matches the runtime it is committed for.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
pkg="gpupool/nodeagent/dra"
out="$root/$pkg/generated"
cd "$root/$pkg/proto"
python3 -m grpc_tools.protoc -I. --python_out="$out" --pyi_out="$out" --grpc_python_out="$out" \
  gpupool_dra_v1.proto gpupool_pluginregistration_v1.proto
# protoc writes sibling imports ("import x_pb2"); make them package-relative.
sed -i -E 's/^import (gpupool_[a-z0-9_]+_pb2) as/from . import \1 as/' "$out"/*_pb2_grpc.py
touch "$out/__init__.py"
echo "regenerated stubs in $out"

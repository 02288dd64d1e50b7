"""gpupool as a Dynamic Resource Allocation (DRA) driver: the kubelet plugin (registration, prepare
and unprepare of ResourceClaims), the per-node ResourceSlice, CDI specs and the prepared-claim
checkpoint (docs/dra.md)."""

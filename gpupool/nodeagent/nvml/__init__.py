"""GPU discovery and health: a backend interface, an NVML implementation and a YAML-driven fake."""

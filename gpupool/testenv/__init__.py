"""A real Kubernetes (v1.20.2) on this machine for end-to-end tests; see docs/testenv.md."""

"""The API client's configuration: the environment's proxy is resolved once, not before every request."""

from __future__ import annotations

import urllib.request
from pathlib import Path
from typing import Any

import kubernetes.client.configuration as configuration_module
import pytest

from gpupool.kube.client_config import api_configuration

KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://127.0.0.1:6443", insecure-skip-tls-verify: true}
users:
- name: u
  user: {token: "secret-token"}
contexts:
- name: x
  context: {cluster: c, user: u}
current-context: x
"""


def _counting_getproxies(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    original = urllib.request.getproxies

    def counting() -> dict[str, str]:
        calls.append(1)
        return original()

    monkeypatch.setattr(configuration_module, "getproxies", counting)
    return calls


def _request_auth(configuration: Any) -> dict[str, Any]:
    # what the client does before every request: run the refresh hook, read the bearer token
    settings: dict[str, Any] = configuration.auth_settings()
    return settings


def test_token_refresh_before_each_request_does_not_read_the_environment_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG)
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    monkeypatch.delenv("https_proxy", raising=False)
    calls = _counting_getproxies(monkeypatch)
    configuration = api_configuration(str(path))
    assert configuration.host == "https://127.0.0.1:6443"
    assert configuration.proxy == "http://proxy.example:3128"  # the environment's, for https
    assert configuration.refresh_api_key_hook is not None  # the loader's per-request hook is kept
    resolved = len(calls)
    for _ in range(5):
        auth = _request_auth(configuration)
        assert auth["BearerToken"]["value"] == "Bearer secret-token"
    assert len(calls) == resolved  # without the fix: one more resolution per request
    assert configuration.proxy == "http://proxy.example:3128"


def test_no_proxy_in_the_environment_stays_no_proxy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG)
    for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.delenv(name, raising=False)
    configuration = api_configuration(str(path))
    _request_auth(configuration)
    assert configuration.proxy is None

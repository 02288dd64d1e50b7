"""The Kubernetes client's configuration, loaded once for every gpupool process that talks to the API.

Why a module of its own: both loaders of the official client (kubeconfig and in-cluster) install a
hook that runs before *every* request to refresh the token, and that hook assigns the API host
again. Assigning the host makes the client resolve the proxy from the environment again
(``urllib.request.getproxies()`` walks every environment variable), a few per cent of the CPU one
bind costs the extender (docs/extender.md, "Numbers behind the code"). The environment does not
change while the process runs, so the proxy is resolved once here and kept; the token refresh itself
is untouched. Both CLI commands load through here, so the extender and the node agent find their
credentials the same way.

One call is one request (``retries = 0``): urllib3's default retries a read that timed out three
times, so one GET of a bind could take four times its timeout, past the bind's deadline and
kube-scheduler's ``httpTimeout``. Every caller already owns its retries: the binder within its
deadline, the watches and the Lease with their back-off.
"""

from __future__ import annotations

from typing import Any


def api_configuration(kubeconfig: str | None = None) -> Any:
    """A ``kubernetes.client.Configuration`` for ``kubeconfig`` (a path), or, without one, for the
    pod's service account when running in a cluster and the default kubeconfig otherwise."""
    from kubernetes import client
    from kubernetes import config as config_module

    loaders: Any = config_module  # the client's loaders are untyped
    configuration = client.Configuration()
    if kubeconfig:
        loaders.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    else:
        try:
            loaders.load_incluster_config(client_configuration=configuration)
        except loaders.ConfigException:
            loaders.load_kube_config(client_configuration=configuration)
    keep_environment_proxy(configuration)
    configuration.retries = 0  # one call, one request (module docstring)
    return configuration


def keep_environment_proxy(configuration: Any) -> None:
    """Fix the proxy the environment gives for the configured host, so that later host assignments
    (the token refresh hook's, before every request) stop resolving it again."""
    configuration.proxy = configuration.proxy  # the setter marks the proxy as explicitly chosen

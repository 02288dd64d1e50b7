"""Which image the pod-scheduler webhook gives a remote-share pod's GPU client init container
(:mod:`gpupool.extender.remote_injection`).

By default the extender's own: it is gpupool's image at the extender's version, and the extender
reads it from its own pod (``--leader-pod``, which the shipped Deployments set), so no deployment
has to keep a second image reference in step with its ``images:`` or ``image.tag``. The flag
``--remote-client-image`` names another (a mirror); ``none`` turns the injection off. An extender
outside a pod (no ``--leader-pod``) injects only when the flag names an image.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

OFF = "none"
"""``--remote-client-image`` value that turns the injection off."""
CONTAINER = "extender"
"""The extender's container in the shipped Deployments."""


def client_image(flag: str | None, own_pod: tuple[str, str] | None,
                 read_pod: Callable[[str, str], Any]) -> str | None:
    """The init container's image, or None (nothing injected): ``flag`` when given (``none``: None),
    else the image of the ``extender`` container (or the only container) of ``own_pod``
    (``(namespace, name)``), read with ``read_pod(name, namespace)``; None, with a warning, when it
    cannot be read."""
    if flag is not None:
        return None if flag in ("", OFF) else flag
    if own_pod is None:
        return None
    namespace, name = own_pod
    try:
        containers = list(read_pod(name, namespace).spec.containers or [])
    except Exception as exc:  # the webhook then injects nothing; pods can still be wired by hand
        log.warning("remote GPU: cannot read this extender's pod %s/%s for its image (%s); remote-share pods get "
                    "no GPU client injected (set --remote-client-image)", namespace, name, exc)
        return None
    named = [c for c in containers if c.name == CONTAINER] or (containers if len(containers) == 1 else [])
    if not named or not named[0].image:
        log.warning("remote GPU: pod %s/%s has no container %r; remote-share pods get no GPU client injected "
                    "(set --remote-client-image)", namespace, name, CONTAINER)
        return None
    return str(named[0].image)

"""The extender's list+watch of DeviceClasses, kept as which classes are gpupool's and what their
own selectors add (issue 24, docs/dra.md "Selectors the extender reads"; started with
``--steer-claim-pods``).

Why: a claim naming an admin's class for gpupool's driver (``a100-share``) asks for gpupool's cards
under that class's selectors too. Without the watch the extender knows only the class named after
the driver. Each change is pushed into the claim store (:meth:`ClaimBookings.set_classes`, which
reads again the asks of the claims naming a changed class) and the template store; a class whose
selectors cannot be read is logged once per change of the class.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from gpupool.extender.claim_classes import TemplateClasses
from gpupool.extender.dra_bookings import ClaimBookings
from gpupool.kube.claim_asks import ClassSelection
from gpupool.kube.device_classes import ClassReading, read_device_class

log = logging.getLogger(__name__)


class GpupoolClasses:
    """Every DeviceClass's reading, by name; fed by the watch, under the cache's lock."""

    def __init__(self, claims: ClaimBookings, lock: threading.RLock, templates: TemplateClasses | None = None) -> None:
        self.claims = claims
        self.lock = lock
        self.templates = templates
        self.readings: dict[str, ClassReading] = {}

    def replace(self, objs: Iterable[Mapping[str, Any]]) -> None:
        """A full list of DeviceClasses."""
        with self.lock:
            before, self.readings = self.readings, {}
            for obj in objs:
                if isinstance(obj, Mapping):
                    self._read(obj, before)
            self._push()
            self.claims.classes_synced = True

    def apply(self, kind: str, obj: Mapping[str, Any]) -> None:
        """One watch event."""
        if not isinstance(obj, Mapping):
            return
        with self.lock:
            if kind == "DELETED":
                self.readings.pop(_name(obj), None)
            else:
                self._read(obj, self.readings)
            self._push()

    def _read(self, obj: Mapping[str, Any], before: Mapping[str, ClassReading]) -> None:
        """Keep ``obj``'s reading; a problem is logged when the class's reading changed (a relist or
        a resync of an unchanged class is not told again)."""
        name = _name(obj)
        reading = read_device_class(obj, self.claims.driver, self.claims.schema)
        if reading.problem is not None and before.get(name) != reading:
            log.info("DeviceClass %s: its claims get no node choice by gpupool: %s", name, reading.problem)
        self.readings[name] = reading

    def _push(self) -> None:
        selections: dict[str, ClassSelection | None] = {self.claims.driver: None}
        for name, reading in self.readings.items():
            if reading.gpupool:
                selections[name] = reading.problem if reading.problem is not None else reading.selection
        self.claims.set_classes(selections)
        if self.templates is not None:
            self.templates.classes = self.claims.classes


def _name(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    return str(meta.get("name") or "") if isinstance(meta, Mapping) else ""

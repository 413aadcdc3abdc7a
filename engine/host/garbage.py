"""Full garbage collections the engine needs, run where the host process wants them (engine thread asks).

A full collection destroys every piece of cyclic garbage in the process, the host's too. A Qt
app's objects must die on its GUI thread (one destroyed elsewhere leaves its timers behind,
and the next timer event crashes), so such a host turns Python's own collections off and
runs them there; it hands this module its way of collecting (``hand_to``). The engine then
asks for the collections it needs (the old model's objects after a swap, a failed step's
tensors) through ``collect``, and waits for the host up to ``HOST_WAIT_S``. Elsewhere (the
CLI, the server) ``collect`` collects on the calling thread.
"""

from __future__ import annotations

import gc
from typing import Callable

HOST_WAIT_S = 5.0
HostCollector = Callable[[float], bool]
"""Runs a full collection on the host's own thread within the given seconds; whether it ran."""

_host_collector: HostCollector | None = None


def hand_to(host_collector: HostCollector | None) -> None:
    """From now on ``collect`` asks ``host_collector`` (None: collects on the calling thread again)."""
    global _host_collector
    _host_collector = host_collector


def collect() -> bool:
    """A full collection, where the host runs them; whether it ran (False: the host did not answer in time)."""
    host_collector = _host_collector
    if host_collector is None:
        gc.collect()
        return True
    return host_collector(HOST_WAIT_S)

"""What the reference side of the diagnosis holds at once, measured, not assumed.

``LiveBytes`` is told of every float64 tensor the walk makes and may keep (each unit's
weights, its module outputs, the tensors its autograd graph saves, its gradients, the unit
inputs kept for the backward), holds each only by a weak reference, and at each ``sample()``
adds up the storages of those still alive (a storage shared by several views once). So a walk
that kept a unit's weights or graph past its step would show it in ``peak``: the count is of
what Python and autograd still hold, not of what the walk meant to free. The walk samples
after each unit's forward (its weights and module outputs alive) and on each side of each
unit's backward (its graph, then its gradients); a no-grad temporary inside a unit's math is
not tracked.
"""

from __future__ import annotations

import contextlib
import weakref

import torch


class LiveBytes:
    def __init__(self) -> None:
        self._refs: list[weakref.ref] = []
        self.peak = 0

    def track(self, *tensors) -> None:
        for t in tensors:
            if isinstance(t, torch.Tensor):
                self._refs.append(weakref.ref(t))
            elif isinstance(t, (tuple, list)):
                self.track(*t)
            elif isinstance(t, dict):
                self.track(*t.values())

    def now(self, among=None) -> int:
        """Bytes of the tracked tensors alive (``among``: only those; default every one)."""
        alive = [r() for r in self._refs]
        self._refs = [r for r, t in zip(self._refs, alive, strict=True) if t is not None]
        tensors = [t for t in alive if t is not None] if among is None else list(among)
        storages = {}
        for t in tensors:
            storage = t.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
        return sum(storages.values())

    def sample(self) -> int:
        held = self.now()
        self.peak = max(self.peak, held)
        return held

    @contextlib.contextmanager
    def graph(self):
        """Inside it, every tensor autograd saves for the backward is tracked."""
        def pack(t):
            self.track(t)
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            yield

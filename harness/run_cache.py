"""Launch each distinct run once per pytest session and share its result."""

from __future__ import annotations

import hashlib
import re
from dataclasses import replace
from pathlib import Path

from harness.devices import DeviceProfile
from harness.launch import RunSpec, launch
from harness.results import RunResult


class RunCache:
    def __init__(self, profile: DeviceProfile, root: Path,
                 rendezvous: tuple[str, ...] = ()) -> None:
        self.profile = profile
        self.root = Path(root)
        self.rendezvous = rendezvous  # torchrun options for multi-node runs (--torchrun-arg)
        self._results: dict[RunSpec, RunResult] = {}

    def get(self, spec: RunSpec) -> RunResult:
        if self.rendezvous and not spec.rendezvous:
            spec = replace(spec, rendezvous=self.rendezvous)
        if spec not in self._results:
            self._results[spec] = launch(spec, self.profile, self.root / self._dirname(spec))
        return self._results[spec]

    def results(self) -> list[RunResult]:
        return list(self._results.values())

    def _dirname(self, spec: RunSpec) -> str:
        # A stable digest (str hash() is salted per process): the same spec gets the same
        # folder on every node of a multi-node run.
        key = repr((spec.overrides, spec.extra_env, spec.save_hf, spec.steps, spec.rendezvous))
        extras = "-" + hashlib.sha1(key.encode()).hexdigest()[:10]
        return re.sub(r"[^A-Za-z0-9_.-]", "_", spec.name + extras)

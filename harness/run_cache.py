"""Launch each distinct run once per pytest session and share its result."""

from __future__ import annotations

import re
from pathlib import Path

from harness.devices import DeviceProfile
from harness.launch import RunSpec, launch
from harness.results import RunResult


class RunCache:
    def __init__(self, profile: DeviceProfile, root: Path) -> None:
        self.profile = profile
        self.root = Path(root)
        self._results: dict[RunSpec, RunResult] = {}

    def get(self, spec: RunSpec) -> RunResult:
        if spec not in self._results:
            self._results[spec] = launch(spec, self.profile, self.root / self._dirname(spec))
        return self._results[spec]

    def results(self) -> list[RunResult]:
        return list(self._results.values())

    def _dirname(self, spec: RunSpec) -> str:
        extras = f"-{abs(hash((spec.overrides, spec.extra_env, spec.save_hf, spec.steps)))}"
        return re.sub(r"[^A-Za-z0-9_.-]", "_", spec.name + extras)

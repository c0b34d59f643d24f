"""Observe what upstream does in a child process started as a launched rank starts.

A probe is a snippet of Python that prints what it observes. ``observe`` runs a batch of
probes in one child interpreter that boots like a rank: the boot ``sitecustomize`` on its
path (harness/rank/boot) installs the shims named in ``HARNESS_SHIMS`` as torch and
torchtitan import, and the child imports this tree's ``harness`` (its environment:
harness/registry/environment.py ``child_environment``). A shim patches the whole
process, so one shim configuration is one child; every probe of the batch pays the child's
imports (torch, torchtitan: several CPU seconds) once between them.

Each probe is isolated from the others: it runs in its own globals with its own captured
stdout; an exception is recorded against that probe (its traceback) and the next one runs;
a process group a probe leaves initialised is destroyed and torch's deterministic-algorithms
setting is restored after it. A probe that kills the child (a crash, ``os._exit``) is
recorded with the child's exit status and stderr, and the probes after it run in a fresh
child of the same configuration.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from harness.registry import environment

# The child: runs the probes of ``argv[1]`` (a JSON list of [name, code]) in order, and after
# each one rewrites ``argv[2]`` with every observation so far. A probe it is running when it
# dies is named in the file as "running".
_CHILD = r"""
import contextlib, io, json, os, sys, traceback
probes, out = json.load(open(sys.argv[1])), sys.argv[2]
observed = {}

def record(name, entry):
    observed[name] = entry
    with open(out + ".tmp", "w") as f:
        json.dump(observed, f)
    os.replace(out + ".tmp", out)

def reset(deterministic):
    torch = sys.modules.get("torch")
    if torch is None:
        return
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    mode, warn_only = deterministic
    torch.use_deterministic_algorithms(mode, warn_only=warn_only)

for name, code in probes:
    torch = sys.modules.get("torch")
    deterministic = ((torch.are_deterministic_algorithms_enabled(),
                      torch.is_deterministic_algorithms_warn_only_enabled())
                     if torch is not None else (False, False))
    record(name, {"running": True})
    printed, error = io.StringIO(), None
    try:
        with contextlib.redirect_stdout(printed):
            exec(compile(code, f"<probe {name}>", "exec"), {"__name__": f"probe_{name}"})
    except BaseException:
        error = traceback.format_exc()
    try:
        reset(deterministic)
    except BaseException:
        error = (error or "") + "after the probe, resetting the process failed:\n" + traceback.format_exc()
    record(name, {"stdout": printed.getvalue(), "error": error})
"""


class ProbeError(AssertionError):
    """A probe raised, or its child died: the probe observed nothing."""


@dataclass(frozen=True)
class Observation:
    probe: str
    shims: tuple[str, ...]
    stdout: str = ""
    error: str | None = None  # the probe's traceback, or how its child died

    def printed(self) -> str:
        """What the probe printed (stripped); a probe that raised raises ``ProbeError``."""
        if self.error is not None:
            raise ProbeError(f"probe {self.probe!r} ({environment.SHIMS}={','.join(self.shims)!r}) "
                             f"observed nothing:\n{self.error}")
        return self.stdout.strip()

    def to_json(self) -> dict:
        return {"probe": self.probe, "shims": list(self.shims), "stdout": self.stdout,
                "error": self.error}

    @classmethod
    def from_json(cls, data: dict) -> Observation:
        return cls(data["probe"], tuple(data["shims"]), data["stdout"], data["error"])


def observe(probes: dict[str, str], shims: tuple[str, ...] = (),
            timeout_s: float = 300) -> dict[str, Observation]:
    """``{name: Observation}`` of every probe in ``probes`` (``{name: code}``, run in this
    order), in as few children of configuration ``shims`` as the probes let live."""
    remaining = list(probes.items())
    found: dict[str, Observation] = {}
    with tempfile.TemporaryDirectory(prefix="harness-probes-") as scratch:
        while remaining:
            batch, out = Path(scratch) / "probes.json", Path(scratch) / "observed.json"
            batch.write_text(json.dumps(remaining))
            out.unlink(missing_ok=True)
            try:
                done = subprocess.run([sys.executable, "-c", _CHILD, str(batch), str(out)],
                                      env=environment.child_environment(rank=True, shims=shims),
                                      capture_output=True,
                                      text=True, timeout=timeout_s)
                died = None if done.returncode == 0 else (
                    f"the child exited with status {done.returncode}; its stderr ends:\n"
                    f"{done.stderr[-3000:]}")
            except subprocess.TimeoutExpired as timeout:
                stderr = timeout.stderr or b""
                stderr = stderr.decode(errors="replace") if isinstance(stderr, bytes) else stderr
                died = f"the child ran past {timeout_s} s; its stderr ends:\n{stderr[-3000:]}"
            observed = json.loads(out.read_text()) if out.is_file() else {}
            for name, entry in observed.items():
                if "running" in entry:
                    found[name] = Observation(name, shims, error=died or "the child stopped in it")
                else:
                    found[name] = Observation(name, shims, entry["stdout"], entry["error"])
            if not observed:  # the child ran none of them (it died at boot): nothing more will
                found.update({name: Observation(name, shims, error=died or "the child ran no probe")
                              for name, _ in remaining})
            remaining = [(name, code) for name, code in remaining if name not in found]
    return found

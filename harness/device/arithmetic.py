"""A machine's arithmetic identity: what decides whether a number recorded elsewhere can be
expected here to the bit.

Seeded runs and forwards are bitwise reproducible on one machine, but float32 rounds the way the
machine's kernels compute it: on CPU, torch picks its vectorised kernels by the CPU's
capability (``torch.backends.cpu.get_cpu_capability()``, or ``ATEN_CPU_CAPABILITY``) and its BLAS
picks its own by vendor and instruction set. Seen: on an AuthenticAMD AVX512 machine the
fixtures' row-causal recorded loss comes out one ulp off the machine that recorded them
(docs/expectations.md, "fixtures on another CPU"). So a recorded number carries the identity of
the arithmetic that made it, and a byte-for-byte comparison is made only where the identity is
the same; elsewhere a check says which part differs.
"""

from __future__ import annotations

import platform

from harness.device.devices import NEURON_AUTO_CAST

CPU_VENDOR = "cpu vendor"
CPU_CAPABILITY = "torch cpu capability"


def _cpuinfo(field: str) -> str | None:
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith(field):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_model() -> str | None:
    """The CPU's model name (recorded beside an identity; not part of it)."""
    return _cpuinfo("model name")


def cpu_identity() -> dict[str, str]:
    """This machine's CPU arithmetic: the vendor (its BLAS kernels) and the capability torch
    dispatches its own kernels for."""
    import torch  # noqa: PLC0415  heavy: torch, for this machine's identity alone

    vendor = _cpuinfo("vendor_id") or platform.processor() or "unknown CPU"
    return {CPU_VENDOR: vendor, CPU_CAPABILITY: torch.backends.cpu.get_cpu_capability()}


def identity(kind: str = "cpu") -> dict[str, str]:
    """The arithmetic identity of device ``kind`` on this machine (harness/device/devices.py
    KINDS): the CPU's for cpu; the GPU's name and compute capability for cuda; for neuron the
    instance type and the compiler's auto-cast setting every neuron run records."""
    if kind == "cpu":
        return cpu_identity()
    if kind == "cuda":
        import torch  # noqa: PLC0415  heavy: torch, for this machine's identity alone

        major, minor = torch.cuda.get_device_capability(0)
        return {"gpu": torch.cuda.get_device_name(0), "compute capability": f"{major}.{minor}"}
    if kind == "neuron":
        try:
            with open("/sys/devices/virtual/dmi/id/product_name") as product:
                instance = product.read().strip()
        except OSError:
            instance = "unknown instance"
        return {"instance": instance, "neuron-auto-cast": NEURON_AUTO_CAST}
    raise ValueError(f"no arithmetic identity for device {kind!r}")


def describe(ident: dict[str, str]) -> str:
    """``AuthenticAMD, torch cpu capability AVX512``: an identity in words."""
    if set(ident) == {CPU_VENDOR, CPU_CAPABILITY}:
        return f"{ident[CPU_VENDOR]}, {CPU_CAPABILITY} {ident[CPU_CAPABILITY]}"
    return ", ".join(f"{k} {v}" for k, v in ident.items())


def machine() -> str:
    """This machine's CPU arithmetic in words (what a skip for another machine names)."""
    return describe(cpu_identity())

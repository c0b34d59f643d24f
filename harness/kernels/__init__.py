"""The kernels and their checks: ``emu`` (the NKI emulator, below), ``ops`` (the harness's
own ops and NKI kernels, on the emulator or the device), ``checks`` (the kernel checks against
per-op references, on top). Imports go emu <- ops <- checks.
"""

#!/usr/bin/env python3
"""Print pip constraints pinning the Neuron image's stack to what is installed.

    python3 -m pip install -e . -c <(python3 constraints/neuron_image.py)

leaves torch, torch-neuronx, torchvision, nki, neuronx-cc and torchtitan (TorchTitan Neuron)
exactly as the image has them: pip may only add what is missing, never replace them. A package
that is not installed is left out (a comment says so), so nothing Neuron is ever pulled from
PyPI (the project lists none of them). Exit status 1 when torch itself is missing (the image
is not the one this is for), and when torchtitan is missing or is not a TorchTitan Neuron build
(``+neuron`` in its version): `pip install -e .` would otherwise resolve `torchtitan>=0.2.2`
to PyPI's 0.3.0 and the night would test the wrong API generation. TorchTitan Neuron is not in
the image: install it first, as the Neuron docs say (training/torchtitan/get-started/
setup-torchtitan-neuron): `git clone https://github.com/aws-neuron/torchtitan-neuron && cd
torchtitan-neuron && pip install -r requirements.txt && pip install -e .`, in the image's venv.
"""

from __future__ import annotations

import sys
from importlib import metadata

# The image's PyTorch/Neuron stack (the XLA-era names too, for images that still carry them).
PACKAGES = ("torch", "torch-neuronx", "torchvision", "nki", "neuronx-cc", "torchtitan",
            "torch-xla", "libneuronxla", "neuronx-distributed")


def constraints() -> list[str]:
    lines = ["# the Neuron image's installed stack (constraints/neuron_image.py)"]
    for name in PACKAGES:
        try:
            version = metadata.version(name)
        except metadata.PackageNotFoundError:
            lines.append(f"# {name}: not installed")
            continue
        lines.append(f"{name}=={version}")
    return lines


FORK_INSTALL = ("git clone https://github.com/aws-neuron/torchtitan-neuron && cd torchtitan-neuron "
                "&& pip install -r requirements.txt && pip install -e .")


def torchtitan_problem(version: str | None) -> str | None:
    """Why the installed torchtitan cannot be the one a Neuron night tests, or None."""
    if version is None:
        return (f"torchtitan is not installed: TorchTitan Neuron does not come with the image; "
                f"install it in the image's venv first ({FORK_INSTALL})")
    if "+neuron" not in version:
        return (f"torchtitan {version} is not a TorchTitan Neuron build (+neuron): a Neuron night "
                f"never tests PyPI's torchtitan; install the fork ({FORK_INSTALL})")
    return None


def main() -> int:
    lines = constraints()
    print("\n".join(lines))
    if "# torch: not installed" in lines:
        print("neuron_image.py: torch is not installed: this is not a Neuron image with its "
              "PyTorch stack; use constraints/cpu.txt instead", file=sys.stderr)
        return 1
    try:
        titan = metadata.version("torchtitan")
    except metadata.PackageNotFoundError:
        titan = None
    problem = torchtitan_problem(titan)
    if problem:
        print(f"neuron_image.py: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

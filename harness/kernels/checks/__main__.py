"""``python -m harness.kernels.checks {list,replay,calibrate}``."""

import sys

from harness.registry.generations import require_supported_stack

require_supported_stack()  # before anything imports torch or torchtitan

from harness.kernels.checks.cli import main  # noqa: E402

sys.exit(main())

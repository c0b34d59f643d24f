"""``python -m harness.kernels.checks {list,replay,calibrate}``."""

import sys

from harness.kernels.checks.cli import main

sys.exit(main())

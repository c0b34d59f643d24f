"""``python -m harness.kernel_checks {list,replay,calibrate}``."""

import sys

from harness.kernel_checks.cli import main

sys.exit(main())

"""``python -m harness.kernels {list,replay,calibrate}``."""

import sys

from harness.kernels.cli import main

sys.exit(main())

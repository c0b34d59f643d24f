"""Data-path checks: an independent reference for what the trainer feeds, the rank-side
state records, an SFT (ignored-label) data path, and the ``--module`` that runs another config
module under a registered backend's name (``instrumented``)."""

"""Data-path checks: an independent reference for what the trainer feeds, rank-side batch
dumps, an SFT (ignored-label) data path, and the instrumented ``--module`` that carries the
rank-side hooks into torchtitan's real trainer."""

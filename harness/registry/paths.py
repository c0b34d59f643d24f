"""Where the project's own fixtures live (nothing comes from the Hugging Face Hub)."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
FIXTURES = REPO_ROOT / "fixtures"
CORPUS = FIXTURES / "corpus"
TOKENIZER = FIXTURES / "tokenizer"
TINY_DENSE = FIXTURES / "tiny_dense"
TINY_MOE = FIXTURES / "tiny_moe"
BOOT_DIR = REPO_ROOT / "harness" / "rank" / "boot"  # first on every launched rank's PYTHONPATH
# Multi-step goldens: <generation>/<device>/<run>.txt (+ .json), scripts/record_goldens.py
GOLDENS = REPO_ROOT / "tests" / "assets" / "losses"

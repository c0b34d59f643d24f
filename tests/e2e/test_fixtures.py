"""The committed fixtures are what scripts/make_fixtures.py makes, byte for byte."""

import subprocess
import sys

import pytest

from harness import paths

SCRIPT = paths.REPO_ROOT / "scripts" / "make_fixtures.py"


def _check(only: str | None) -> subprocess.CompletedProcess:
    command = [sys.executable, str(SCRIPT), "--check"] + (["--only", only] if only else [])
    return subprocess.run(command, capture_output=True, text=True, timeout=3600)


def test_corpus_and_tokenizer_regenerate_bit_identically():
    done = _check("corpus,tokenizer")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


@pytest.mark.slow
def test_pretrained_checkpoints_regenerate_bit_identically():
    done = _check(None)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def test_committed_fixtures_stay_small():
    size = sum(p.stat().st_size for p in paths.FIXTURES.rglob("*") if p.is_file())
    assert size < 20 * 1024**2, f"fixtures/ holds {size / 1024**2:.1f} MiB (limit 20 MiB)"

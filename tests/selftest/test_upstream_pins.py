"""The upstreams pinned beyond PyPI (constraints/upstream.toml) install from their real source or
from a mirror, the same commit checked either way (scripts/get_upstream.py).

Specification:
- every pin names its real repository and commit, its artifact and that artifact's sha256;
- a mirrored artifact is taken only with the pin's sha256; a source checkout only at the pin's
  commit; anything else is refused, naming both;
- a test that needs a pin it does not find skips naming the one command that installs it.
"""

import hashlib
import importlib.util
import subprocess
from dataclasses import replace

import pytest

from harness.registry import paths, upstream

SCRIPT = paths.REPO_ROOT / "scripts" / "get_upstream.py"


@pytest.fixture(scope="module")
def get_upstream():
    spec = importlib.util.spec_from_file_location("get_upstream", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_pin_names_its_real_source_commit_and_artifact():
    for pin in upstream.pins().values():
        assert pin.repo.startswith("https://github.com/") and len(pin.commit) >= 7, pin
        assert len(pin.sha256) == 64 and pin.artifact and pin.kind in upstream.KINDS, pin
        assert pin.commit[:7] in pin.artifact or pin.version in pin.artifact, pin


def _pin(tmp_path, monkeypatch, body: bytes, **fields):
    monkeypatch.setattr(upstream, "UPSTREAM_DIR", tmp_path / "build")
    return replace(upstream.pin("nki-library-tests"), sha256=hashlib.sha256(body).hexdigest(), **fields)


def test_a_mirrored_artifact_is_taken_only_with_the_pins_sha256(tmp_path, monkeypatch, get_upstream):
    pin = _pin(tmp_path, monkeypatch, b"the artifact built from the commit")
    mirror = tmp_path / "mirror"
    (mirror / pin.mirror_dir).mkdir(parents=True)
    (mirror / pin.mirror_dir / pin.artifact).write_bytes(b"the artifact built from the commit")
    monkeypatch.setattr(get_upstream, "UPSTREAM_DIR", tmp_path / "build")
    assert get_upstream.from_mirror(pin, mirror).read_bytes() == b"the artifact built from the commit"
    (mirror / pin.mirror_dir / pin.artifact).write_bytes(b"another build")
    with pytest.raises(get_upstream.UpstreamError, match=f"the pin's is {pin.sha256}"):
        get_upstream.from_mirror(pin, mirror)
    with pytest.raises(get_upstream.UpstreamError, match="is not in the mirror"):
        get_upstream.from_mirror(pin, tmp_path / "empty")


def _repo(folder):
    def run(*a):
        return subprocess.run(["git", "-C", str(folder), *a], check=True, capture_output=True, text=True)

    folder.mkdir()
    run("init", "-q")
    (folder / "src").mkdir()
    (folder / "test").mkdir()
    (folder / "src" / "k.py").write_text("first\n")
    (folder / "test" / "t.py").write_text("x\n")
    run("add", ".")
    run("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "pinned")
    pinned = run("rev-parse", "HEAD").stdout.strip()
    (folder / "src" / "k.py").write_text("later\n")
    run("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "later")
    return pinned


def test_a_source_checkout_is_built_at_the_pins_commit_only(tmp_path, monkeypatch, get_upstream):
    pinned = _repo(tmp_path / "nki-library")
    pin = _pin(tmp_path, monkeypatch, b"", repo=str(tmp_path / "nki-library"), commit=pinned[:7])
    monkeypatch.setattr(get_upstream, "SOURCES", tmp_path / "src")
    archive = get_upstream.from_source(pin)
    listing = subprocess.run(["tar", "xzOf", str(archive), "nki-library/src/k.py"], capture_output=True,
                             text=True, check=True).stdout
    assert listing == "first\n", "the archive holds the pinned commit's files, not the branch tip's"
    with pytest.raises(subprocess.CalledProcessError):
        get_upstream.from_source(replace(pin, commit="0" * 40))


def test_a_missing_pin_skips_naming_the_command_that_installs_it(monkeypatch):
    pin = upstream.pin("nki-library")
    monkeypatch.setattr(upstream, "pins", lambda: {"nki-library": replace(pin, probe="no_such_package_here")})
    reason = upstream.missing("nki-library")
    assert reason == (f"nki-library ({pin.repo} at {pin.commit}) is not installed here: "
                      f"`python3 scripts/get_upstream.py nki-library` installs it")


def test_only_ci_speaks_of_its_offline_mirror():
    """Users have no sibling folder of artifacts: only .ci/ names the mirror CI installs from;
    everything else speaks of the pins (constraints/upstream.toml, scripts/get_upstream.py)."""
    mirror = "../" + "shared"  # spelled apart so this file is not a hit itself
    tracked = subprocess.run(["git", "-C", str(paths.REPO_ROOT), "ls-files"], capture_output=True,
                             text=True, check=True).stdout.split()
    hits = [f"{name}:{number}" for name in tracked if not name.startswith(".ci/")
            and (paths.REPO_ROOT / name).is_file()
            for number, line in enumerate((paths.REPO_ROOT / name).read_text(errors="ignore").splitlines(), 1)
            if mirror in line]
    assert not hits, hits

"""The run template's instantiation: one parameter per RunCase (device x backend x size x
attention x init), marked with its device tier; the runs themselves are shared per session."""

from pathlib import Path

import pytest

from harness.backends import ASSETS_MODEL
from harness.devices import TIER_MARKERS
from harness.run_matrix import SubjectCase, cases

REQUIRED_ASSET_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json")
DOWNLOAD = (f"huggingface-cli download Qwen/{ASSETS_MODEL} "
            f"--local-dir <assets-dir>/{ASSETS_MODEL}")


def _param(case):
    marks = [getattr(pytest.mark, TIER_MARKERS[case.device])] if case.device in TIER_MARKERS else []
    if case.slow:
        marks.append(pytest.mark.slow)
    return pytest.param(case, id=case.id, marks=marks)


def _subject_cases(config: pytest.Config) -> list:
    """``--subject M:C``: a user's config function, on the device this machine has."""
    import sys

    from harness.devices import detect
    from harness.subjects import Subject

    folders = tuple(str(Path(p).resolve()) for p in (config.getoption("--subject-path") or ["."]))
    for folder in folders:
        if folder not in sys.path:
            sys.path.insert(0, folder)
    device = config.getoption("--device") or detect().kind
    return [SubjectCase(device, Subject.parse(text), folders) for text in config.getoption("--subject")]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "run_case" in metafunc.fixturenames:
        params = [_param(c) for c in cases()]
        params += [pytest.param(c, id=c.id) for c in _subject_cases(metafunc.config)]
        metafunc.parametrize("run_case", params, scope="session")


def full_size_assets(pytestconfig) -> Path:
    """The HF assets dir of the full-size runs; a skip naming the download when absent."""
    root = pytestconfig.getoption("--assets-dir")
    if root is None:
        pytest.skip(f"--assets-dir not given; fetch the assets with: {DOWNLOAD}")
    path = Path(root) / ASSETS_MODEL
    missing = [f for f in REQUIRED_ASSET_FILES if not (path / f).is_file()]
    if not any(path.glob("*.safetensors")):
        missing.append("*.safetensors")
    if missing:
        pytest.skip(f"{path} lacks {missing}; fetch the assets with: {DOWNLOAD}")
    return path


@pytest.fixture(scope="session")
def launched_run(run_case, device_runs, steps, workarounds, pytestconfig):
    """The run of ``run_case``, launched once per session on its device."""
    assets = str(full_size_assets(pytestconfig)) if getattr(run_case, "size", "") == "full" else None
    return device_runs(run_case.device).get(run_case.run_spec(steps, assets, workarounds))

"""The harness's environment variables and the names of a run's folder are spelled in one module
each: harness/registry/environment.py and harness/registry/dump_layout.py; every other module
imports them.

Specification:
- every string constant of the Python source of harness/, conftest.py and scripts/ (the nightly's
  own scripts aside: they read the workflow's variables before the harness is installed, and
  import no harness module at their top) is read with ``ast``, f-strings' literal parts too;
- a constant that is a harness variable's name (``HARNESS_`` and capitals) outside
  environment.py is reported as ``path:line 'name'``; every variable environment.py names
  starts with its ``PREFIX``, and no two share a name;
- a constant that is a name of the run folder's layout (dump_layout's run-cache and run-folder
  names: ``launcher.log``, ``command.txt``, ``verdicts``, ``torchrun``, ``dump``, the ledger,
  the siblings ``.lock``, ``.result.pickle``, ``.read``, ...) outside dump_layout.py is reported
  alike.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from harness.registry import dump_layout, environment, paths

VARIABLE = re.compile(r"HARNESS_[A-Z0-9_]+")
# The run cache's and the run folder's names (the dump's own are the rank side's, read through
# dump_layout alike); a pattern by its longest fixed part.
# (The report's ``runs`` is left out: results.json has a key of that name.)
RUN_FOLDER_NAMES = {
    dump_layout.LEDGER, dump_layout.PREFETCH_CLAIM, dump_layout.PREFETCH_SPECS,
    dump_layout.PREFETCH_LOG, dump_layout.LOCK, dump_layout.STORED_RESULT, dump_layout.READ_MARK,
    dump_layout.WHOLE_COPY, dump_layout.COMMAND, dump_layout.LAUNCHER_LOG, dump_layout.TORCHRUN_LOGS,
    dump_layout.VERDICTS, dump_layout.DUMP, *dump_layout.RANK_LOG_FILES,
    *(max(re.split(r"\{\w+\}", pattern), key=len)
      for pattern in (dump_layout.RUNS_FOLDER, dump_layout.NODE_LAUNCHER_LOG)),
}


def sources() -> list[Path]:
    root = paths.REPO_ROOT
    return [*sorted((root / "harness").rglob("*.py")), root / "conftest.py",
            *sorted((root / "scripts").glob("*.py"))]


def constants(path: Path) -> list[tuple[int, str]]:
    """Every string constant of ``path`` (the literal parts of f-strings too), with its line."""
    return [(node.lineno, node.value) for node in ast.walk(ast.parse(path.read_text(), str(path)))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)]


def spelled_outside(home: Path, wanted) -> list[str]:
    """``path:line 'constant'`` for every constant ``wanted(constant)`` holds outside ``home``."""
    root = paths.REPO_ROOT
    return [f"{path.relative_to(root)}:{line} {value!r}" for path in sources() if path != home
            for line, value in constants(path) if wanted(value)]


def test_every_harness_variable_is_named_in_the_environment_module_only():
    found = spelled_outside(Path(environment.__file__), VARIABLE.fullmatch)
    assert not found, ("harness variables spelled outside harness/registry/environment.py "
                       f"(import the name from there): {found}")


def test_the_environment_module_names_each_variable_once_under_its_prefix():
    named = {name: value for name, value in vars(environment).items()
             if name.isupper() and isinstance(value, str) and VARIABLE.fullmatch(value)}
    assert named and all(value.startswith(environment.PREFIX) for value in named.values())
    assert len(set(named.values())) == len(named), named
    assert set(environment.RANK_ONLY) <= set(named.values())


def test_every_name_of_the_run_folder_is_spelled_in_the_layout_module_only():
    found = spelled_outside(Path(dump_layout.__file__), RUN_FOLDER_NAMES.__contains__)
    assert not found, ("names of a run's folder spelled outside harness/registry/dump_layout.py "
                       f"(use its functions): {found}")

"""Every process the demo, the tests and the benches start goes through one launcher:
``harness/processes.py`` holds the only ``subprocess.Popen`` and the only ``free_port``, and
the control plane's command lines (daphne, the Celery worker and beat) are written there once."""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HOME = "harness/processes.py"


def _python_files() -> dict[str, str]:
    names = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "*.py"], capture_output=True, text=True, check=True
    ).stdout.split()
    return {n: (ROOT / n).read_text() for n in names if (ROOT / n).exists()}


def _where(pattern: str, files: dict[str, str]) -> list[str]:
    found = re.compile(pattern)
    return sorted(
        f"{name}:{n}"
        for name, text in files.items()
        for n, line in enumerate(text.splitlines(), 1)
        if found.search(line) and name != "tests/test_one_launcher.py"
    )


def test_child_processes_start_in_one_place():
    files = _python_files()
    starts = _where(r"\bPopen\(|create_subprocess_exec\(|os\.(fork|spawn\w*)\(", files)
    assert [s.split(":")[0] for s in starts] == [HOME], starts
    assert [s.split(":")[0] for s in _where(r"^\s*def free_port\(", files)] == [HOME]


def test_the_control_plane_command_lines_are_written_once():
    files = _python_files()
    # "-m", "daphne" / "-m", "celery" written out as an argv: only in the launcher.
    argv = _where(r"""["']-m["'],\s*["'](daphne|celery)["']""", files)
    assert {s.split(":")[0] for s in argv} <= {HOME}, argv
    assert len(argv) == 3, argv  # daphne, the worker and beat

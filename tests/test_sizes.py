"""The size check `make lint` runs (tests/sizes.py) names each product function over 80 lines
and each product file over 450, and leaves tests, benches and migrations alone."""

from pathlib import Path

from tests.sizes import MAX_FILE_LINES, MAX_FUNCTION_LINES, check


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def _function(name: str, lines: int, indent: str = "") -> str:
    """A function of exactly ``lines`` lines, its ``def`` line included."""
    body = "".join(f"{indent}    x{i} = {i}\n" for i in range(lines - 2))
    return f"{indent}def {name}():\n{body}{indent}    return 0\n"


def test_short_functions_and_files_pass(tmp_path):
    ok = _function("fits", MAX_FUNCTION_LINES)
    assert check(_tree(tmp_path, {"nodeagent/a.py": ok, "harness/b.py": ok})) == []


def test_each_long_function_and_file_is_named_with_file_and_line(tmp_path):
    method = "class Agent:\n" + _function("__init__", MAX_FUNCTION_LINES + 1, "    ")
    inner = _function("inner", MAX_FUNCTION_LINES + 5, "    ")
    nested = "def outer():\n    x = 1\n" + inner + "    return inner\n"
    files = {
        "nodeagent/agent.py": method,
        "controlplane/sim/x.py": "\n" + nested,
        "wire/big.py": "x = 1\n" * (MAX_FILE_LINES + 1),
        "frontend/ok.py": "x = 1\n" * MAX_FILE_LINES,
    }
    problems = check(_tree(tmp_path, files))
    assert problems == [
        "controlplane/sim/x.py:2: outer is 88 lines (over 80)",
        "controlplane/sim/x.py:4: outer.inner is 85 lines (over 80)",
        "nodeagent/agent.py:2: Agent.__init__ is 81 lines (over 80)",
        "wire/big.py: 451 lines (over 450)",
    ]


def test_tests_benches_and_migrations_are_not_product(tmp_path):
    long = _function("long", MAX_FUNCTION_LINES + 20)
    files = {
        "tests/test_x.py": long,
        "bench/b.py": long,
        "controlplane/fleet/migrations/0001_initial.py": long,
    }
    assert check(_tree(tmp_path, files)) == []

"""No product function over 80 lines, no product file over 450 (part of `make lint`).

A long function is read as a list of named steps; a long file holds more than one thing. The
product is the Python under ``controlplane/``, ``nodeagent/``, ``wire/``, ``harness/`` and
``frontend/``; migrations are generated and left out. A function's length runs from its ``def``
line to its last line (decorators not counted); a nested function counts on its own and inside
the function that holds it.

    python tests/sizes.py [ROOT]     # exits 1 with one line per offender
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PRODUCT_DIRS = ("controlplane/", "nodeagent/", "wire/", "harness/", "frontend/")
MAX_FUNCTION_LINES = 80
MAX_FILE_LINES = 450


def product_files(root: Path) -> list[str]:
    """The product's Python files git tracks under ``root`` (every file when not a checkout)."""
    out = subprocess.run(
        ["git", "-C", str(root), "ls-files", "*.py"], capture_output=True, text=True, check=False
    )
    if out.returncode == 0 and out.stdout.strip():
        files = out.stdout.split()
    else:
        files = [str(p.relative_to(root)) for p in root.rglob("*.py")]
    return sorted(
        {
            f
            for f in files
            if f.startswith(PRODUCT_DIRS) and "/migrations/" not in f and (root / f).is_file()
        }
    )  # a set: during a merge git lists an unmerged file once per stage


def _functions(tree: ast.AST):
    """Each function in ``tree`` with its dotted name (``Class.method``, ``outer.inner``)."""

    def walk(node: ast.AST, prefix: str):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    yield name, child
                yield from walk(child, f"{name}.")
            else:
                yield from walk(child, prefix)

    yield from walk(tree, "")


def check_file(root: Path, rel: str) -> list[str]:
    text = (root / rel).read_text(errors="replace")
    problems = []
    lines = len(text.splitlines())
    if lines > MAX_FILE_LINES:
        problems.append(f"{rel}: {lines} lines (over {MAX_FILE_LINES})")
    for name, node in _functions(ast.parse(text, filename=rel)):
        length = (node.end_lineno or node.lineno) - node.lineno + 1
        if length > MAX_FUNCTION_LINES:
            problems.append(
                f"{rel}:{node.lineno}: {name} is {length} lines (over {MAX_FUNCTION_LINES})"
            )
    return problems


def check(root: Path) -> list[str]:
    return [p for rel in product_files(root) for p in check_file(root, rel)]


def main(argv: list[str]) -> int:
    root = Path(argv[1] if len(argv) > 1 else Path(__file__).resolve().parents[1]).resolve()
    problems = check(root)
    if not problems:
        return 0
    print("\n".join(problems))
    files = sum(1 for p in problems if p.endswith(f"(over {MAX_FILE_LINES})"))
    print(
        f"sizes: {len(problems) - files} function(s) over {MAX_FUNCTION_LINES} lines, "
        f"{files} file(s) over {MAX_FILE_LINES}",
        file=sys.stderr,
    )
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))

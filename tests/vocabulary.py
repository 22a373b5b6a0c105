"""``make lint``'s vocabulary check: ``wire/protocol.py`` spells the wire vocabulary
once, and no other module of the product quotes it.

The rule, precisely:

- A *hit* is a Python string literal whose whole value is one of ``CHECKED`` (``ast.Constant``,
  so a word inside a sentence, an f-string's text or a docstring is not one), in a ``.py`` file
  under ``controlplane/``, ``nodeagent/``, ``wire/``, ``harness/`` or ``bench/``.
- ``CHECKED`` is every value protocol.py gives the tiers (``TIER_*``), actions, transports, job
  states, engine lifecycle, confirmation sources, token kinds, realtime event names and message
  types, except ``AMBIGUOUS``: words this tree also uses for something else, each named below.
  Roles (``source``/``target``), report modes (``delta``/``snapshot``), encodings and content
  types are not checked at all: they are also field names, dashboard message types and MIME
  types all over the tree.
- Exempt files: ``wire/protocol.py`` (the definitions), ``*/migrations/*`` (frozen
  history: a migration keeps the literal it was generated with, and rewriting one changes
  nothing in the database) and ``tests/`` (a test spells the wire by hand on purpose, so that a
  changed spelling in protocol.py fails it).
- Exempt line: a literal whose line carries ``# not-vocabulary: <reason>`` is the same word
  meaning something else (a URL scheme, torch's backend name, an audit action); the reason is
  required.

``python tests/vocabulary.py`` prints ``file:line: 'word' (NAME)`` for each hit and exits 1 if
there is any.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from wire import protocol  # noqa: E402  (the repository on the path first)

CHECKED_PREFIXES = ("TIER_", "ACTION_", "TRANSPORT_", "JOB_", "ENGINE_", "CONFIRM_", "TOKEN_")
CHECKED_PREFIXES += ("EVENT_", "MSG_")
AMBIGUOUS = {
    "user": "ApiToken.user and request.user, DRF's own 'user' throttle scope",
    "pending": "plan, override and forecast states share it",
    "running": "vLLM's num_requests_running metric, process states",
    "failed": "counters, LMCache's and Celery's task statuses",
    "lost": "a GPU's lost flag (NVML lost the device)",
    "error": "the key of every error body",
}
SCANNED = ("controlplane", "nodeagent", "wire", "harness", "bench")
EXEMPT_FILES = ("wire/protocol.py",)
PRAGMA = re.compile(r"#\s*not-vocabulary:\s*\S")


def vocabulary() -> dict[str, str]:
    """word -> the protocol name that spells it."""
    out: dict[str, str] = {}
    for name, value in vars(protocol).items():
        if name.startswith(CHECKED_PREFIXES) and isinstance(value, str):
            if value not in AMBIGUOUS:
                out.setdefault(value, name)
    return out


def exempt(rel: str) -> bool:
    return rel in EXEMPT_FILES or "/migrations/" in f"/{rel}"


def hits(root: Path = REPO) -> Iterator[tuple[str, int, str, str]]:
    """(file, line, word, protocol name) for every quoted vocabulary word outside protocol.py."""
    words = vocabulary()
    for top in SCANNED:
        for path in sorted((root / top).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if exempt(rel):
                continue
            text = path.read_text()
            lines = text.splitlines()
            for node in ast.walk(ast.parse(text, rel)):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    if node.value in words and not PRAGMA.search(lines[node.lineno - 1]):
                        yield rel, node.lineno, node.value, words[node.value]


def main() -> int:
    found = sorted(hits())
    for rel, line, word, name in found:
        print(f"{rel}:{line}: {word!r} is protocol.{name}: import it, do not quote it")
    if found:
        print(f"{len(found)} quoted vocabulary word(s) (tests/vocabulary.py says the rule)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

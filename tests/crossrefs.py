"""Cross-references in the docs and the product resolve (part of `make lint`).

Docs say what exists now, so a reader who follows a reference must land somewhere:
- no ``issue <n>`` or ``session <n>`` in the docs, the READMEs or product code: development
  history belongs in commits (studies under ``experiments/`` may cite it);
- every relative markdown link (``[text](path)``) names a file or folder that exists;
- every ``<file>.md "Heading"`` (or ``<file>.md, "Heading"``) names a file that exists and has
  that heading (or a bold label of that name);
- every ``section <n>`` / ``§<n>`` of one of our documents (``architecture section 5``,
  ``docs/x.md section 2``, or one with no source named) names a numbered heading that exists;
  a section of an outside work (``FPP3 section 5.5``) is left alone.

    python tests/crossrefs.py [ROOT]     # exits 1 with one line per broken reference

Files: the tracked markdown files, the Makefile, and the Python and template files of the
product, the harness and the benches.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

CODE_DIRS = ("controlplane", "nodeagent", "wire", "harness", "bench", "deploy", "docker")
CODE_SUFFIXES = (".py", ".yaml", ".yml", ".toml", ".html", ".js", ".css")
# Where ``issue <n>`` / ``session <n>`` may appear: studies and tests keep their history.
HISTORY_ALLOWED = ("experiments/", "tests/")

HISTORY = re.compile(r"\b(issue|session)s?\s+#?\d+", re.IGNORECASE)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING_REF = re.compile(r"([\w./-]+\.md)\)?,?\s+(?:section\s+)?\"([^\"]+)\"")
SECTION = re.compile(r"(?:([\w./'-]+),?\s+)?(?:\bsection|§)\s*(\d+(?:\.\d+)*)", re.IGNORECASE)
# Names of our documents used before "section <n>".
OUR_DOCS = {"architecture": "docs/architecture.md"}


def tracked(root: Path) -> list[str]:
    """The files git tracks under ``root`` (every file, when ``root`` is not a checkout)."""
    out = subprocess.run(
        ["git", "-C", str(root), "ls-files"], capture_output=True, text=True, check=False
    )
    if out.returncode == 0 and out.stdout.strip():
        return out.stdout.split()
    return [str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()]


def scanned(files: list[str]) -> list[str]:
    return [
        f
        for f in files
        if f.endswith(".md")
        or f == "Makefile"
        or (f.startswith(CODE_DIRS) and f.endswith(CODE_SUFFIXES))
    ]


def headings(path: Path) -> list[str]:
    """The headings of a markdown file, and its bold labels (``**Label**``), lower-cased."""
    text = path.read_text(errors="replace")
    found = [ln.lstrip("#").strip() for ln in text.splitlines() if ln.startswith("#")]
    found += re.findall(r"\*\*([^*]+)\*\*", text)
    return [h.replace("`", "").lower() for h in found]


def _resolve(root: Path, here: Path, name: str) -> Path | None:
    for base in (root, here.parent):
        candidate = (base / name).resolve()
        if candidate.exists():
            return candidate
    return None


def _cites(word: str) -> bool:
    """Whether the word before "section <n>" names an outside work (``FPP3``, ``FAST'25``,
    ``3rd ed.``): a digit, an apostrophe, a period or capitals past the first letter. A plain
    word ("see", "Above") names no source: the section is then this document's."""
    word = word.rstrip(",")
    return bool(re.search(r"[0-9'.]", word)) or word[1:] != word[1:].lower()


def _section(root: Path, here: Path, source: str | None, number: str) -> str:
    """Why ``section <number>`` after ``source`` does not resolve, or ``""``."""
    word = (source or "").rstrip(",")
    if word.endswith(".md"):
        target = _resolve(root, here, word)
        if target is None:
            return f"section {number} of {source}: no such file"
    elif word.lower() in OUR_DOCS:
        target = root / OUR_DOCS[word.lower()]
        if not target.exists():
            return f"section {number} of {OUR_DOCS[word.lower()]}: no such file"
    elif not word or not _cites(word):
        target = here if here.suffix == ".md" else None
        if target is None:
            return f"section {number}: which document? (no numbered sections in code)"
    else:
        return ""  # a section of an outside work (a paper, a book)
    pattern = re.compile(rf"^#+\s*{re.escape(number)}[.\s]")
    if any(pattern.match(ln) for ln in target.read_text(errors="replace").splitlines()):
        return ""
    return f"section {number} of {target.relative_to(root)}: no heading numbered {number}"


def check_file(root: Path, rel: str) -> list[str]:
    path = root / rel
    try:
        text = path.read_text(errors="replace")
    except (OSError, UnicodeDecodeError):
        return []
    problems = []
    history = not rel.startswith(HISTORY_ALLOWED)
    for n, line in enumerate(text.splitlines(), 1):
        where = f"{rel}:{n}"
        if history:
            for m in HISTORY.finditer(line):
                problems.append(f"{where}: {m.group(0)!r}: history belongs in commits")
        if rel.endswith(".md"):
            for m in LINK.finditer(line):
                target = m.group(1)
                if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                    continue  # a URL or an anchor on this page
                name = target.split("#", 1)[0]
                if name and not (path.parent / name).exists():
                    problems.append(f"{where}: link {target!r}: no such file")
        for m in HEADING_REF.finditer(line):
            doc, title = m.group(1), m.group(2)
            target = _resolve(root, path, doc)
            if target is None:
                problems.append(f'{where}: {doc} "{title}": no such file')
            elif not any(title.replace("`", "").lower() in h for h in headings(target)):
                problems.append(f'{where}: {doc} "{title}": no such heading')
        for m in SECTION.finditer(line):
            why = _section(root, path, m.group(1), m.group(2))
            if why:
                problems.append(f"{where}: {why}")
    return problems


def check(root: Path) -> list[str]:
    return [p for rel in scanned(tracked(root)) for p in check_file(root, rel)]


def main(argv: list[str]) -> int:
    root = Path(argv[1] if len(argv) > 1 else Path(__file__).resolve().parents[1]).resolve()
    problems = check(root)
    for p in problems:
        print(p)
    if problems:
        print(f"crossrefs: {len(problems)} reference(s) that do not resolve", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

"""The cross-reference check `make lint` runs (tests/crossrefs.py) fails on each kind of
reference that points nowhere, and passes the ones that resolve."""

from pathlib import Path

from tests.crossrefs import check


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


GOOD = {
    "docs/guide.md": "# Guide\n\n## 2. Install\n\n## Request tap\n\n**Sizing** matters.\n",
    "docs/other.md": (
        "# Other\n\nSee [the guide](guide.md#install), ![a chart](../bench/chart.png) and "
        "[a site](https://example.org/x.md).\n"
        'As docs/guide.md "Request tap" says, and docs/guide.md, "Sizing"; docs/guide.md '
        "section 2. FPP3 section 5.5 is a book's.\n"
    ),
    "bench/chart.png": "",
    "controlplane/mod.py": '"""Sessions of 30 s (docs/guide.md, "Request tap")."""\n',
    "experiments/study/README.md": "Issue 12 asked this; session 3 ran it.\n",
}


def test_references_that_resolve_pass(tmp_path):
    assert check(_tree(tmp_path, GOOD)) == []


def test_each_kind_of_broken_reference_is_named_with_file_and_line(tmp_path):
    bad = {
        **GOOD,
        "docs/bad.md": (
            "# Bad\n"
            "Fixed in issue 41.\n"
            "See [gone](moved/README.md).\n"
            'As docs/guide.md "Uninstall" says.\n'
            'And docs/nowhere.md "Install".\n'
            "The budget (architecture section 5).\n"
            "Above, section 3.\n"
        ),
        "controlplane/bad.py": '"""Planned in session 7 (ARCHITECTURE.md section 8)."""\n',
        "README.md": "Run it as [the demo](docs/demo.md) says.\n",
    }
    problems = check(_tree(tmp_path, bad))
    assert sorted(p.split(": ", 1)[0] for p in problems) == [
        "README.md:1",
        "controlplane/bad.py:1",
        "controlplane/bad.py:1",
        "docs/bad.md:2",
        "docs/bad.md:3",
        "docs/bad.md:4",
        "docs/bad.md:5",
        "docs/bad.md:6",
        "docs/bad.md:7",
    ], problems
    text = "\n".join(problems)
    assert "'issue 41': history belongs in commits" in text
    assert "'session 7'" in text and "ARCHITECTURE.md: no such file" in text
    assert "link 'moved/README.md': no such file" in text
    assert 'docs/guide.md "Uninstall": no such heading' in text
    assert 'docs/nowhere.md "Install": no such file' in text
    assert "section 5 of docs/architecture.md: no such file" in text
    assert "section 3 of docs/bad.md: no heading numbered 3" in text


def test_the_repository_passes():
    assert check(Path(__file__).resolve().parents[1]) == []

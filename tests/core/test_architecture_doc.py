"""docs/architecture.md is built from the import-linter contracts in pyproject.toml: every
contract is named on the page and every module of every layers contract is in its tables."""

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "architecture.md").read_text()
CONTRACTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"][
    "contracts"
]


def _head(name: str) -> tuple[str, ...]:
    name = re.sub(r"\(.*?\)", "", name.split(":")[0])  # the name's head, not its details
    return tuple(re.findall(r"\w+", name.lower())[:3])


def test_every_contract_is_named_on_the_page():
    named = {_head(n) for n in re.findall(r'contract "([^"]+)"', " ".join(DOC.split()))}
    for c in CONTRACTS:
        assert _head(c["name"]) in named, f"contract {c['name']!r} is not on docs/architecture.md"


def test_every_layer_module_is_in_the_page():
    shown = set(re.findall(r"`([\w.]+)`", DOC))
    for c in CONTRACTS:
        if c["type"] != "layers":
            continue
        for layer in c["layers"]:
            for module in (m.strip() for m in layer.split("|")):
                assert module in shown, f"{c['name']}: {module} is not on docs/architecture.md"

"""One source per policy knob: each knob's default and range are declared once
(``core.policy.knobs``), and the model, its database constraints, the API, the core budgets and
the simulator read them; a policy becomes budgets in one translation (``Budgets.of``). The
source scan fails where a second default for a knob is written (a literal default of a field or
parameter named after a knob, or the simulator's budgets defaulting again)."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import math
from pathlib import Path

import pytest

from controlplane.core.policy import knobs
from controlplane.core.policy.types import Budgets
from controlplane.replication.api.serializers import PolicySerializer
from controlplane.replication.models import Policy
from controlplane.sim.planned import SIMULATED, PlannedPolicy

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("controlplane", "harness", "bench", "nodeagent", "wire", "frontend")
NAMES = set(knobs.BY_FIELD) | set(knobs.BY_BUDGET) | {k.api for k in knobs.KNOBS}
# A knob's name that means something else there: the agent's and the copy loader's polling
# interval is ``interval_s`` too, and neither reads a policy.
OTHER_MEANING = {"interval_s": ("nodeagent/", "harness/e2e/engines.py")}


def _bounds(validators) -> tuple:
    lows = [v.limit_value for v in validators if type(v).__name__ == "MinValueValidator"]
    highs = [v.limit_value for v in validators if type(v).__name__ == "MaxValueValidator"]
    return min(lows, default=None), max(highs, default=None)


@pytest.mark.parametrize("knob", knobs.KNOBS, ids=lambda k: k.field)
def test_the_model_and_the_api_read_the_knob(knob):
    field = Policy._meta.get_field(knob.field)
    assert field.default == knob.default
    assert field.null is knob.nullable
    assert _bounds(field.validators) == (knob.low, knob.high)
    assert field.column == knob.api  # a renamed knob keeps its column
    constraints = {c.name for c in Policy._meta.constraints}
    assert f"{knob.api}_range" in constraints
    api = PolicySerializer().fields[knob.api]  # the API keeps the name its clients send
    assert api.source == knob.field
    assert (api.min_value, api.max_value) == (knob.low, knob.high)
    # No second range: at most the name's mapping.
    assert set(PolicySerializer.Meta.extra_kwargs.get(knob.api, {})) <= {"source"}


def test_the_api_keeps_its_names_the_model_says_s():
    """Durations are ``_s`` on the model and ``_seconds`` in the API, both ways."""
    out = PolicySerializer(Policy(horizon_s=120, max_queue_s=None)).data
    assert (out["horizon_seconds"], out["max_queue_seconds"]) == (120, None)
    assert not {k.field for k in knobs.KNOBS if k.api != k.field} & set(out)
    given = PolicySerializer(Policy(), data={"horizon_seconds": 120}, partial=True)
    assert given.is_valid(), given.errors
    assert dict(given.validated_data) == {"horizon_s": 120}
    short = PolicySerializer(Policy(), data={"horizon_seconds": 5}, partial=True)
    assert not short.is_valid() and set(short.errors) == {"horizon_seconds"}


def test_the_demos_policies_name_the_apis_fields():
    """The demos' policies go through ``ensure_policy``, the API's serializer, which ignores a
    name it does not know: each must be one of its fields (``horizon_seconds``, not the model's
    ``horizon_s``)."""
    from harness.launch import POLICY
    from harness.realvllm.demo import REAL_POLICY

    known = set(PolicySerializer().fields)
    assert set(POLICY) - known == set() and set(REAL_POLICY) - known == set()


@pytest.mark.parametrize("knob", list(knobs.BY_BUDGET.values()), ids=lambda k: k.field)
def test_the_budgets_read_the_knob(knob):
    default = {f.name: f.default for f in dataclasses.fields(Budgets)}[knob.budget]
    assert default == knob.budget_default
    for bad in (knob.low - 1, knob.high * 2 + 1):
        with pytest.raises(ValueError):
            Budgets(**{knob.budget: bad})
    if knob.nullable:  # empty: no limit
        assert getattr(Budgets(**{knob.budget: math.inf}), knob.budget) == math.inf
    else:
        with pytest.raises(ValueError):
            Budgets(**{knob.budget: math.inf})


def test_a_policy_becomes_budgets_in_one_translation():
    assert Budgets.of(Policy()) == Budgets()  # the model's defaults are the budgets'
    p = Policy(max_queue_s=None, max_cluster_queue_s=None, horizon_s=120)
    b = Budgets.of(p, min_expected_hits=1.6)
    assert (b.max_queue_s, b.max_cluster_queue_s) == (math.inf, math.inf)
    assert (b.horizon_s, b.min_expected_hits) == (120.0, 1.6)


def test_the_simulator_passes_its_setting_in():
    """The simulator's planned policies have no budgets of their own: their setting is named
    (``SIMULATED``) and passed in."""
    assert inspect.signature(PlannedPolicy).parameters["budgets"].default is inspect.Parameter.empty
    assert set(SIMULATED) <= {f.name for f in dataclasses.fields(Budgets)}


def _literal(v) -> bool:
    if isinstance(v, ast.UnaryOp):
        return _literal(v.operand)
    if isinstance(v, ast.BinOp):
        return _literal(v.left) and _literal(v.right)
    return isinstance(v, ast.Constant) and type(v.value) in (int, float)


def _named_values(node: ast.AST) -> list[tuple[str, ast.expr | None]]:
    """(name, value) of what ``node`` gives a default: an annotated field, a parameter, or a
    model field's ``default=``."""
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return [(node.target.id, node.value)]
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        a = node.args
        pos = a.posonlyargs + a.args
        with_default = pos[len(pos) - len(a.defaults) :]
        return [(x.arg, d) for x, d in zip(with_default, a.defaults, strict=True)] + [
            (x.arg, d) for x, d in zip(a.kwonlyargs, a.kw_defaults, strict=True)
        ]
    if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
        names = [t.id for t in node.targets if isinstance(t, ast.Name)]
        return [(n, kw.value) for n in names for kw in node.value.keywords if kw.arg == "default"]
    return []


def second_defaults(root: Path = ROOT) -> list[str]:
    """Literal defaults of fields and parameters named after a knob in the product's code
    (migrations, frozen history, aside)."""
    found = []
    for top in PRODUCT:
        for path in sorted((root / top).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                where = path.relative_to(root).as_posix()
                for name, value in _named_values(node):
                    if where.startswith(OTHER_MEANING.get(name, ())):
                        continue
                    if name in NAMES and value is not None and _literal(value):
                        found.append(f"{where}:{node.lineno} {name}")
    return found


def test_grep_finds_one_default_per_knob():
    assert second_defaults() == []


def test_the_scan_finds_a_second_default(tmp_path):
    (tmp_path / "controlplane").mkdir()
    (tmp_path / "controlplane" / "x.py").write_text(
        "class B:\n    max_spec_vram_fraction: float = 0.25\n\n"
        "def f(horizon_s=120.0):\n    pass\n\n"
        "min_confidence = models.FloatField(default=0.4)\n"
        "def g(interval_s=60, horizon_seconds=120):\n    pass\n"
    )
    for top in PRODUCT[1:]:
        (tmp_path / top).mkdir()
    (tmp_path / "nodeagent" / "y.py").write_text("def poll(interval_s=1.0):\n    pass\n")
    assert sorted(second_defaults(tmp_path)) == [
        "controlplane/x.py:2 max_spec_vram_fraction",
        "controlplane/x.py:4 horizon_s",
        "controlplane/x.py:7 min_confidence",
        "controlplane/x.py:8 horizon_seconds",
        "controlplane/x.py:8 interval_s",
    ]

"""ChoiceSet: one declaration gives a constant its value and the field its (value, label)."""

from controlplane.choiceset import ChoiceSet


class Colour(ChoiceSet):
    RED = "red", "Red"
    BLUE = "blue", "Blue (the sky)"
    WARM = frozenset({RED})  # the body sees values, not pairs
    NAMES = ("red", "blue", "green")  # not a (value, label) pair: left as written


class Spelled(ChoiceSet):
    A = "a"
    CHOICES = [(A, "A"), ("b", "B")]


def test_pairs_become_values_and_choices_in_order():
    assert Colour.RED == "red" and Colour.BLUE == "blue"
    assert Colour.CHOICES == [("red", "Red"), ("blue", "Blue (the sky)")]
    assert Colour.values() == ["red", "blue"]
    assert Colour.WARM == frozenset({"red"}) and len(Colour.NAMES) == 3


def test_a_spelled_out_choices_list_is_kept():
    assert Spelled.CHOICES == [("a", "A"), ("b", "B")] and Spelled.values() == ["a", "b"]


def test_the_model_choices_are_unchanged():
    from controlplane.fleet.choices import EngineKind, NodeState
    from controlplane.replication.choices import ItemDecision, PlanState

    assert NodeState.CHOICES[1] == ("stale", "Stale (missed heartbeats)")
    assert EngineKind.VLLM == "vllm" and len(EngineKind.CHOICES) == 5
    assert PlanState.OPEN == frozenset({"proposed", "partially_approved"})
    assert ItemDecision.HELD_OUT == "held_out"

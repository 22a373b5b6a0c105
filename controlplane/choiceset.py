"""Named choices declared once: ``NAME = value, label`` gives the constant its value and the
field its ``(value, label)`` pair (NetBox's ``ChoiceSet``).

    class PolicyMode(ChoiceSet):
        SHADOW = "shadow", "Shadow: plan and score, move nothing"

    PolicyMode.SHADOW == "shadow"
    PolicyMode.CHOICES == [("shadow", "Shadow: plan and score, move nothing")]

Other class attributes (sets of values, maps) are left as written, and see the values: a body
may say ``OPEN = frozenset({PROPOSED, PARTIAL})``. A class that spells ``CHOICES`` itself keeps
it (a list built from the wire vocabulary, say).
"""

from __future__ import annotations

from typing import Any


class _Declarations(dict):
    """The class body's namespace: an UPPER_CASE ``(value, label)`` pair is stored as its value
    and the pair kept, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.pairs: list[tuple[str, str]] = []

    def __setitem__(self, key: str, value: Any) -> None:
        if (
            key.isupper()
            and isinstance(value, tuple)
            and len(value) == 2
            and all(isinstance(v, str) for v in value)
        ):
            self.pairs.append(value)
            value = value[0]
        super().__setitem__(key, value)


class _ChoiceSetType(type):
    @classmethod
    def __prepare__(mcs, name, bases, **kwargs):  # type: ignore[override]
        return _Declarations()

    def __new__(mcs, name, bases, namespace, **kwargs):
        cls = super().__new__(mcs, name, bases, dict(namespace))
        if "CHOICES" not in namespace:
            cls.CHOICES = list(namespace.pairs)
        return cls


class ChoiceSet(metaclass=_ChoiceSetType):
    """Base of every model field's choices."""

    CHOICES: list[tuple[str, str]] = []

    @classmethod
    def values(cls) -> list[str]:
        return [value for value, _ in cls.CHOICES]

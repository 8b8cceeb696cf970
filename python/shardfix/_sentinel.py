"""Named default values that mean "not given", for signatures that must tell an omitted argument from any value a
caller could pass (None included), and still read well in `help()` and `inspect.signature`."""

from __future__ import annotations


class Sentinel:
    """A unique marker compared with `is`; its repr is its name, and copies are itself."""

    __slots__ = ("_name",)

    def __init__(self, name: str):
        self._name = name

    def __repr__(self) -> str:
        return self._name

    def __copy__(self) -> Sentinel:
        return self

    def __deepcopy__(self, memo: dict) -> Sentinel:
        return self

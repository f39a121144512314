"""Reading JSON objects field by field, with errors that name the field.

Bundle members are plain JSON on disk. `Fields` wraps one JSON object and checks each field's kind
as it is read; a missing field or a value of the wrong kind raises `SchemaError` naming the field's
path in its document (`engines[0].backend`), what it should be and what it is. Callers add the file
name and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence


class SchemaError(ValueError):
    """A JSON document does not have the shape its reader expects; the message names the field."""


def describe(value: Any) -> str:
    """What a JSON value is, for error messages: `a list`, `the string 'x'`, `null`."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return f"the string {value[:40]!r}"
    return f"the number {value!r}"


def _is_integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True)
class Fields:
    """One JSON object being read; `path` is where it sits in its document ("" at the top)."""

    data: Mapping[str, Any]
    path: str = ""

    @classmethod
    def of(cls, value: Any, path: str = "", what: str = "an object") -> "Fields":
        if not isinstance(value, dict):
            raise SchemaError(f"{path or 'the document'} must be {what}, got {describe(value)}")
        return cls(value, path)

    def where(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name

    def has(self, name: str) -> bool:
        return name in self.data

    def value(self, name: str) -> Any:
        if name not in self.data:
            inside = f" in {self.path}" if self.path else ""
            raise SchemaError(f"field {name!r} is missing{inside}")
        return self.data[name]

    def wrong(self, name: str, what: str) -> SchemaError:
        return SchemaError(f"{self.where(name)} must be {what}, got {describe(self.data.get(name))}")

    def text(self, name: str) -> str:
        value = self.value(name)
        if not isinstance(value, str) or not value:
            raise self.wrong(name, "a non-empty string")
        return value

    def choice(self, name: str, choices: Sequence[str]) -> str:
        value = self.value(name)
        if value not in choices:
            raise self.wrong(name, "one of " + ", ".join(repr(c) for c in choices))
        return value

    def integer(self, name: str, minimum: int | None = None) -> int:
        value = self.value(name)
        if not _is_integer(value) or (minimum is not None and value < minimum):
            raise self.wrong(name, "an integer" + (f" >= {minimum}" if minimum is not None else ""))
        return value

    def number(self, name: str) -> float:
        value = self.value(name)
        if not _is_number(value):
            raise self.wrong(name, "a number")
        return float(value)

    def obj(self, name: str, what: str = "an object") -> "Fields":
        value = self.value(name)
        if not isinstance(value, dict):
            raise self.wrong(name, what)
        return Fields(value, self.where(name))

    def items(self, name: str, what: str = "a list") -> list[Any]:
        value = self.value(name)
        if not isinstance(value, list):
            raise self.wrong(name, what)
        return value

    def strings(self, name: str) -> tuple[str, ...]:
        values = self.items(name, "a list of strings")
        if not all(isinstance(v, str) for v in values):
            raise self.wrong(name, "a list of strings")
        return tuple(values)

    def integers(self, name: str, length: int | None = None, minimum: int | None = None) -> tuple[int, ...]:
        what = f"a list of {length or 'some'} integers" + (f" >= {minimum}" if minimum is not None else "")
        values = self.items(name, what)
        ok = all(_is_integer(v) and (minimum is None or v >= minimum) for v in values)
        if not ok or (length is not None and len(values) != length) or not values:
            raise self.wrong(name, what)
        return tuple(values)

    def numbers(self, name: str, length: int) -> tuple[float, ...]:
        values = self.items(name, f"a list of {length} numbers")
        if len(values) != length or not all(_is_number(v) for v in values):
            raise self.wrong(name, f"a list of {length} numbers")
        return tuple(float(v) for v in values)

"""Partition pruning: which partition paths can hold rows that satisfy a reader's filters.

Filters are simple predicates ``(column, op, value)`` (ops ``= == != < <= > >= in not in``, plus
``is null`` / ``is not null`` with no value), all of which must hold. Those on partition columns decide
which partition directories are listed at all; every filter is still applied to the rows that are read
(:func:`arrow_filter`, on the executors), so pruning only ever saves reading, it never changes a result.
A partition whose values cannot be compared with a filter (an unexpected directory name, a value of
another type) is kept.

Partition values come from the path the way :func:`~cowrite.engine.records.partition_paths` wrote them:
``field=value`` segments (hive style) or bare values in field order, ``__HIVE_DEFAULT_PARTITION__``
for null, dates as ISO dates, timestamps as microseconds since the epoch.
"""

from __future__ import annotations

import datetime as dt
import decimal
import operator
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from cowrite.engine.records import DEFAULT_PARTITION
from cowrite.errors import ConfigError
from cowrite.format.table import Table
from cowrite.storage.backend import Storage

_ARROW_COMPARE = {
    "=": pc.equal,
    "==": pc.equal,
    "!=": pc.not_equal,
    "<": pc.less,
    "<=": pc.less_equal,
    ">": pc.greater,
    ">=": pc.greater_equal,
}
_COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    "=": operator.eq,
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
OPS = (*_COMPARE, "in", "not in", "is null", "is not null")


@dataclass(frozen=True)
class Predicate:
    column: str
    op: str
    value: Any = None

    @classmethod
    def of(cls, item: Predicate | Sequence[Any]) -> Predicate:
        if isinstance(item, Predicate):
            found = item
        elif len(item) == 2:
            found = cls(str(item[0]), str(item[1]).lower())
        elif len(item) == 3:
            found = cls(str(item[0]), str(item[1]).lower(), item[2])
        else:
            raise ConfigError(f"filter {item!r} is not (column, op, value)")
        if found.op not in OPS:
            raise ConfigError(f"filter {item!r}: operator {found.op!r} is not one of {', '.join(OPS)}")
        return found

    def may_hold(self, raw: str) -> bool:
        """False only if no row of a partition whose value of ``column`` is ``raw`` can satisfy this."""
        if raw == DEFAULT_PARTITION:
            if self.op in ("is null", "is not null"):
                return self.op == "is null"
            return False  # comparisons with null are never true
        if self.op in ("is null", "is not null"):
            return self.op == "is not null"
        values = self.value if self.op in ("in", "not in") else [self.value]
        try:
            parsed = [(_parse(raw, v), v) for v in values]
        except (ValueError, TypeError, ArithmeticError):
            return True
        if self.op == "in":
            return any(p == v for p, v in parsed)
        if self.op == "not in":
            return all(p != v for p, v in parsed)
        compare = _COMPARE[self.op]
        try:
            return bool(compare(*parsed[0]))
        except TypeError:
            return True


def _parse(raw: str, like: Any) -> Any:
    """``raw`` (a partition path value) as a value of ``like``'s type; raises when it cannot tell."""
    if like is None:
        raise TypeError("no value to compare")
    if isinstance(like, bool):
        if raw not in ("true", "false"):
            raise ValueError(raw)
        return raw == "true"
    if isinstance(like, int):
        return int(raw)
    if isinstance(like, float):
        return float(raw)
    if isinstance(like, decimal.Decimal):
        return decimal.Decimal(raw)
    if isinstance(like, dt.datetime):
        raise TypeError("timestamps in paths are not compared")  # time zones make it ambiguous
    if isinstance(like, dt.date):
        return dt.date.fromisoformat(raw)
    if isinstance(like, str):
        return raw
    raise TypeError(f"cannot compare partition values with {type(like).__name__}")


def predicates(filters: Iterable[Predicate | Sequence[Any]] | None) -> tuple[Predicate, ...]:
    return tuple(Predicate.of(f) for f in filters or ())


def segment_value(segment: str, field: str, hive_style: bool) -> str | None:
    """The raw value of ``field`` in one path segment; None if the segment is not of this field."""
    if not hive_style:
        return segment
    name, sep, value = segment.partition("=")
    return value if sep and name == field else None


def partition_matches(path: str, fields: Sequence[str], hive_style: bool, rules: Sequence[Predicate]) -> bool:
    """Whether rows of partition ``path`` may satisfy ``rules`` (unreadable paths are kept)."""
    segments = path.split("/") if path else []
    if len(segments) != len(fields):
        return True
    for segment, name in zip(segments, fields, strict=True):
        raw = segment_value(segment, name, hive_style)
        if raw is None:
            return True
        if not all(rule.may_hold(raw) for rule in rules if rule.column == name):
            return False
    return True


def matching_partitions(table: Table, rules: Sequence[Predicate]) -> list[str] | None:
    """Partition paths that may hold matching rows, found by listing directories level by level.

    None when no rule is on a partition column (read everything, listing it in one walk).
    """
    fields = table.partition_fields
    if not fields or not any(rule.column in fields for rule in rules):
        return None
    storage: Storage = table.storage
    paths = [""]
    for name in fields:
        on_field = [rule for rule in rules if rule.column == name]
        found = []
        for prefix in paths:
            for directory in storage.list_dirs(prefix):
                segment = directory.rsplit("/", 1)[-1]
                if not prefix and segment.startswith("."):
                    continue  # .hoodie and other hidden directories
                raw = segment_value(segment, name, table.hive_style_partitioning)
                if raw is None or all(rule.may_hold(raw) for rule in on_field):
                    found.append(directory)
        paths = found
    return sorted(paths)


def arrow_filter(table: pa.Table, rules: Sequence[Predicate]) -> pa.Table:
    """The rows of ``table`` that satisfy every rule (SQL semantics: a comparison with null is false)."""
    mask: Any = None
    for rule in rules:
        if rule.column not in table.column_names:
            continue
        column = table.column(rule.column)
        if rule.op in ("is null", "is not null"):
            holds = pc.is_null(column) if rule.op == "is null" else pc.is_valid(column)
        else:
            try:
                if rule.op in ("in", "not in"):
                    values = pa.array(list(rule.value)).cast(column.type)
                    holds = pc.is_in(column, value_set=values)
                    holds = pc.and_(pc.invert(holds), pc.is_valid(column)) if rule.op == "not in" else holds
                else:
                    holds = _ARROW_COMPARE[rule.op](column, pa.scalar(rule.value).cast(column.type))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
                raise ConfigError(
                    f"filter {rule} does not fit column {rule.column} ({column.type}): {exc}"
                ) from None
        holds = pc.fill_null(holds, False)
        mask = holds if mask is None else pc.and_(mask, holds)
    return table if mask is None else table.filter(mask)

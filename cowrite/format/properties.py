"""``hoodie.properties`` as bytes: the java-properties encoding Hudi's readers expect."""

from __future__ import annotations

import io
from collections.abc import Mapping

from jproperties import Properties

from cowrite.errors import InvalidTablePropertiesError


def format_properties(values: Mapping[str, str]) -> bytes:
    properties = Properties()
    for name in sorted(values):
        properties[name] = values[name]
    out = io.BytesIO()
    properties.store(out, encoding="utf-8", timestamp=False)
    return out.getvalue()


def parse_properties(data: bytes, path: str) -> dict[str, str]:
    """Raise :class:`InvalidTablePropertiesError` (naming ``path``) on anything that is not properties."""
    properties = Properties()
    try:
        properties.load(data, "utf-8")
    except Exception as exc:  # jproperties raises several kinds on malformed input
        raise InvalidTablePropertiesError(f"{path} is not a readable properties file: {exc}") from None
    return {name: value.data for name, value in properties.items()}

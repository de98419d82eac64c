"""The daemon's configuration: a TOML file (as the helm chart renders it), overridden by flags.

```toml
[server]
host = "127.0.0.1"          # 0.0.0.0 in a pod, so Prometheus can scrape it
port = 9464

[follow]
poll_interval_seconds = 5   # how often timelines, heartbeats and locks are looked at

[cleaner]
interval_seconds = 300      # how often old file versions are cleaned
commits_retained = 10

[overlay]
snapshot_every = 100        # segments of the END_COMMIT_TIME log between two snapshots

[[tables]]
uri = "s3://bucket/warehouse/orders"
name = "orders"             # optional; default: the table's hoodie.table.name
"hoodie.client.heartbeat.interval_in_ms" = "60000"   # optional settings for this table
```

The token that guards endpoints that change anything comes from ``COWRITE_DAEMON_TOKEN``; without it
those endpoints are off.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from cowrite.daemon.overlay import DEFAULT_SNAPSHOT_EVERY
from cowrite.errors import ConfigError

TOKEN_VARIABLE = "COWRITE_DAEMON_TOKEN"


@dataclass(frozen=True)
class TableEntry:
    uri: str
    name: str | None = None
    settings: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class DaemonConfig:
    tables: tuple[TableEntry, ...]
    host: str = "127.0.0.1"
    port: int = 9464
    poll_interval: float = 5.0
    clean_interval: float = 300.0
    commits_retained: int | None = None  # None: each table's hoodie.cleaner.commits.retained
    token: str | None = None
    locks_kept: int = 10  # filesystem lock files kept when old ones are collected
    overlay_snapshot_every: int = DEFAULT_SNAPSHOT_EVERY  # segments of the overlay's log per snapshot

    @classmethod
    def load(cls, path: str | None, tables: Sequence[str] = (), **overrides: Any) -> DaemonConfig:
        """The file at ``path`` (if any) plus ``tables`` given on the command line and flag overrides."""
        document: dict[str, Any] = {}
        if path:
            try:
                document = tomllib.loads(Path(path).read_text())
            except (OSError, tomllib.TOMLDecodeError) as exc:
                raise ConfigError(f"cannot read daemon configuration {path}: {exc}") from None
        server, follow, cleaner, overlay = (
            _section(document, name, path) for name in ("server", "follow", "cleaner", "overlay")
        )
        entries = [_table(item, path) for item in document.get("tables", [])]
        entries += [TableEntry(uri) for uri in tables]
        if not entries:
            raise ConfigError("no tables to serve: name them as arguments or in [[tables]] of --config")
        try:
            config = cls(
                tables=tuple(entries),
                host=str(server.get("host", cls.host)),
                port=int(server.get("port", cls.port)),
                poll_interval=float(follow.get("poll_interval_seconds", cls.poll_interval)),
                clean_interval=float(cleaner.get("interval_seconds", cls.clean_interval)),
                commits_retained=_optional_int(cleaner.get("commits_retained")),
                overlay_snapshot_every=int(overlay.get("snapshot_every", cls.overlay_snapshot_every)),
                token=os.environ.get(TOKEN_VARIABLE) or None,
            )
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"invalid daemon configuration {path}: {exc}") from None
        config = replace(config, **{k: v for k, v in overrides.items() if v is not None})
        if config.poll_interval <= 0 or config.clean_interval <= 0:
            raise ConfigError("poll and clean intervals must be positive")
        if config.overlay_snapshot_every < 1:
            raise ConfigError("[overlay] snapshot_every must be at least 1")
        return config


def _section(document: Mapping[str, Any], name: str, path: str | None) -> Mapping[str, Any]:
    section = document.get(name, {})
    if not isinstance(section, Mapping):
        raise ConfigError(f"[{name}] in {path} must be a table")
    return section


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _flatten(values: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Unquoted dotted keys in TOML become nested tables; settings want them flat again."""
    flat: dict[str, str] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f"{name}."))
        else:
            flat[name] = str(value).lower() if isinstance(value, bool) else str(value)
    return flat


def _table(item: Any, path: str | None) -> TableEntry:
    if isinstance(item, str):
        return TableEntry(item)
    if not isinstance(item, Mapping) or not isinstance(item.get("uri"), str):
        raise ConfigError(f"every [[tables]] entry in {path} needs a uri")
    rest = {k: v for k, v in item.items() if k not in ("uri", "name")}
    return TableEntry(item["uri"], item.get("name"), _flatten(rest))

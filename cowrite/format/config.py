"""The one typed registry of configuration keys.

Every setting cowrite reads is a :class:`ConfigKey` declared here, with its default, its parser and a line
of documentation — except those only the Spark engine reads, declared in ``cowrite/spark/options.py``
(registered here when that module is imported; this layer imports no engine). Hudi's own key names are
used wherever Hudi has the concept, so a ``hoodie.properties`` or a Spark option written for Hudi means
the same thing here. Values travel as strings (as they do in ``hoodie.properties`` and in Spark options)
and are parsed on read by :meth:`Config.get`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from cowrite.errors import ConfigError

T = TypeVar("T")

REGISTRY: dict[str, ConfigKey[object]] = {}


def parse_bool(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no", ""):
        return False
    raise ValueError(f"{value!r} is not a boolean (true/false)")


def parse_list(value: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in value.split(",") if part.strip())


def parse_positive_int(value: str) -> int:
    number = int(value)
    if number <= 0:
        raise ValueError(f"{number} is not positive")
    return number


@dataclass(frozen=True)
class ConfigKey(Generic[T]):
    key: str
    default: T
    parse: Callable[[str], T]
    doc: str

    def __post_init__(self) -> None:
        REGISTRY[self.key] = self  # type: ignore[assignment]


def _str(value: str) -> str:
    return value


# -- table properties (.hoodie/hoodie.properties) ------------------------------------------------------
TABLE_NAME = ConfigKey("hoodie.table.name", "", _str, "Name of the table.")
TABLE_TYPE = ConfigKey("hoodie.table.type", "COPY_ON_WRITE", _str, "Only COPY_ON_WRITE is written.")
TABLE_VERSION = ConfigKey("hoodie.table.version", 8, int, "Hudi table version; cowrite serves 8.")
TIMELINE_LAYOUT_VERSION = ConfigKey(
    "hoodie.timeline.layout.version", 2, int, "Timeline layout; 2 keeps instants in .hoodie/timeline/."
)
RECORD_KEY_FIELDS: ConfigKey[tuple[str, ...]] = ConfigKey(
    "hoodie.table.recordkey.fields", (), parse_list, "Comma-separated columns that identify a record."
)
PARTITION_FIELDS: ConfigKey[tuple[str, ...]] = ConfigKey(
    "hoodie.table.partition.fields", (), parse_list, "Comma-separated partition columns; empty = none."
)
ORDERING_FIELDS: ConfigKey[tuple[str, ...]] = ConfigKey(
    "hoodie.table.ordering.fields",
    (),
    parse_list,
    "Column deciding between two versions of a key: the larger value wins, a tie goes to the later write.",
)
PRECOMBINE_FIELD = ConfigKey(
    "hoodie.table.precombine.field", "", _str, "Older Hudi name of the ordering field, written for them."
)
HIVE_STYLE_PARTITIONING = ConfigKey(
    "hoodie.datasource.write.hive_style_partitioning",
    False,
    parse_bool,
    "Partition directories named field=value instead of value.",
)
BASE_FILE_FORMAT = ConfigKey("hoodie.table.base.file.format", "PARQUET", _str, "Only PARQUET.")
TABLE_CREATE_SCHEMA = ConfigKey(
    "hoodie.table.create.schema",
    "",
    _str,
    "Avro record schema (JSON) fixed when the table was created; the first commit's schema otherwise.",
)
POPULATE_META_FIELDS = ConfigKey(
    "hoodie.populate.meta.fields", True, parse_bool, "Base files carry the _hoodie_* columns."
)
METADATA_ENABLE = ConfigKey(
    "hoodie.metadata.enable", False, parse_bool, "Hudi's metadata table; cowrite keeps it off."
)
KEY_GENERATOR_CLASS = ConfigKey(
    "hoodie.table.keygenerator.class",
    "org.apache.hudi.keygen.ComplexAvroKeyGenerator",
    _str,
    "Key generator named for Hudi's Java readers; keys are formatted like Hudi's complex key generator.",
)
TIMELINE_TIMEZONE = ConfigKey("hoodie.table.timeline.timezone", "UTC", _str, "Instant times are UTC.")
CREATE_SCHEMA = ConfigKey("hoodie.table.create.schema", "", _str, "Avro schema the table was created with.")

# -- writing -----------------------------------------------------------------------------------------
PARQUET_MAX_FILE_SIZE = ConfigKey(
    "hoodie.parquet.max.file.size",
    120 * 1024 * 1024,
    parse_positive_int,
    "Target size of a base file in bytes; inserts go to a new file group past it.",
)
PARQUET_SMALL_FILE_LIMIT = ConfigKey(
    "hoodie.parquet.small.file.limit",
    100 * 1024 * 1024,
    int,
    "Base files smaller than this receive inserts before new file groups are opened (0 disables).",
)
PARQUET_COMPRESSION = ConfigKey(
    "hoodie.parquet.compression.codec", "snappy", _str, "Compression codec of base files."
)


class Config:
    """String-valued settings read through typed keys."""

    def __init__(self, values: Mapping[str, str] | None = None) -> None:
        self._values = {str(k): str(v) for k, v in (values or {}).items()}

    def get(self, key: ConfigKey[T]) -> T:
        raw = self._values.get(key.key)
        if raw is None:
            return key.default
        try:
            return key.parse(raw)
        except (ValueError, RecursionError) as exc:  # RecursionError: absurdly nested JSON values
            raise ConfigError(f"invalid value {raw!r} for {key.key}: {exc}. {key.doc}") from None

    def require(self, key: ConfigKey[T]) -> T:
        if key.key not in self._values:
            raise ConfigError(f"missing required setting {key.key}: {key.doc}")
        return self.get(key)

    def with_values(self, values: Mapping[str, str]) -> Config:
        return Config({**self._values, **values})

    def raw(self) -> dict[str, str]:
        return dict(self._values)

    def __contains__(self, key: object) -> bool:
        return (key.key if isinstance(key, ConfigKey) else key) in self._values


# -- concurrency ---------------------------------------------------------------------------------------
LOCK_PROVIDER = ConfigKey(
    "hoodie.write.lock.provider",
    "filesystem",
    _str,
    "Table lock: filesystem (lock files under .hoodie/locks), zookeeper, or in-process; Hudi's class "
    "names of the same providers are accepted too.",
)
LOCK_WAIT_MS = ConfigKey(
    "hoodie.write.lock.wait_time_ms", 60_000, int, "How long a writer waits for the table lock in total."
)
LOCK_RETRY_WAIT_MS = ConfigKey(
    "hoodie.write.lock.wait_time_ms_between_retry",
    5,
    int,
    "First pause between two tries to take the lock; doubles up to the maximum, with jitter.",
)
LOCK_MAX_RETRY_WAIT_MS = ConfigKey(
    "hoodie.write.lock.max_wait_time_ms_between_retry", 50, int,
    "Longest pause between two tries (short: waiting writers take the lock soon after it is free).",
)
ZK_URL = ConfigKey("hoodie.write.lock.zookeeper.url", "", _str, "ZooKeeper host(s), comma-separated.")
ZK_PORT = ConfigKey("hoodie.write.lock.zookeeper.port", 2181, int, "ZooKeeper port for hosts without one.")
ZK_BASE_PATH = ConfigKey(
    "hoodie.write.lock.zookeeper.base_path", "/cowrite/locks", _str, "ZooKeeper node under which locks live."
)
ZK_LOCK_KEY = ConfigKey(
    "hoodie.write.lock.zookeeper.lock_key", "", _str, "Lock node name; defaults to the table name."
)
ZK_SESSION_TIMEOUT_MS = ConfigKey(
    "hoodie.write.lock.zookeeper.session_timeout_ms", 60_000, int, "ZooKeeper session timeout."
)
ZK_CONNECTION_TIMEOUT_MS = ConfigKey(
    "hoodie.write.lock.zookeeper.connection_timeout_ms", 15_000, int, "ZooKeeper connection timeout."
)
HEARTBEAT_INTERVAL_MS = ConfigKey(
    "hoodie.client.heartbeat.interval_in_ms",
    60_000,
    parse_positive_int,
    "How often a writer renews .hoodie/.heartbeat/<instant>.",
)
HEARTBEAT_TOLERABLE_MISSES = ConfigKey(
    "hoodie.client.heartbeat.tolerable.misses",
    2,
    parse_positive_int,
    "A writer is failed when its heartbeat is older than interval x misses.",
)
LEASE_SAFETY_MARGIN_MS = ConfigKey(
    "cowrite.lease.safety.margin.ms",
    -1,
    int,
    "A writer publishes only if its lease has at least this much time left; -1 = half a heartbeat interval.",
)
LOCK_STANDING_MS = ConfigKey(
    "cowrite.lock.standing.ms",
    3000,
    int,
    "Filesystem lock on an object store: how long a writer's turn may stand once its commit is published, "
    "publishing the commits other writers hand it over a connection; 0 = never.",
)
LOCK_STANDING_IDLE_MS = ConfigKey(
    "cowrite.lock.standing.idle.ms",
    300,
    int,
    "How long a standing turn of the lock waits for the next commit handed to it before it ends.",
)
LOCK_STANDING_ADDRESS = ConfigKey(
    "cowrite.lock.standing.address",
    "127.0.0.1",
    _str,
    "Where a standing turn listens: an address of this host the table's other writers can reach "
    "(127.0.0.1: writers on this host only; others go through the store).",
)
RETRIES_ON_CONFLICT = ConfigKey(
    "hoodie.write.num.retries.on.conflict.failures",
    0,
    int,
    "How often a write that lost a conflict is retried, each time as a new instant (0 = never).",
)
CONFLICT_STRATEGY = ConfigKey(
    "hoodie.write.lock.conflict.resolution.strategy",
    "file-group",
    _str,
    "How concurrent instants conflict: file-group (overlapping file groups) or a dotted path to a "
    "callable; Hudi's SimpleConcurrentFileWritesConflictResolutionStrategy means file-group.",
)

# The strategies a table's stored properties may name; a dotted path is honoured only from a writer's own
# options (see Table.open).
BUILTIN_CONFLICT_STRATEGIES = frozenset(
    {"file-group", "org.apache.hudi.client.transaction.SimpleConcurrentFileWritesConflictResolutionStrategy"}
)

# -- table services ------------------------------------------------------------------------------------
CLEANER_COMMITS_RETAINED = ConfigKey(
    "hoodie.cleaner.commits.retained",
    10,
    int,
    "Cleaning keeps every file version the last N data commits (and time travel to them) need.",
)
KEEP_MIN_COMMITS = ConfigKey(
    "hoodie.keep.min.commits",
    20,
    int,
    "Archival leaves at least this many data commits on the active timeline.",
)
KEEP_MAX_COMMITS = ConfigKey(
    "hoodie.keep.max.commits", 30, int, "Archival starts once more data commits than this are active."
)
EARLY_CONFLICT_DETECTION = ConfigKey(
    "hoodie.write.concurrency.early.conflict.detection.enable",
    False,
    parse_bool,
    "While writing, abort as soon as a commit since begin, or a live writer with an earlier instant, plans "
    "to touch the same file group, instead of after the whole write.",
)
EARLY_CONFLICT_PERIOD_MS = ConfigKey(
    "hoodie.write.concurrency.async.conflict.detector.period_ms",
    1_000,
    int,
    "Least time between two early conflict checks of one writer.",
)
CONFLICT_ON_RECORD_KEYS = ConfigKey(
    "cowrite.write.conflict.record.keys",
    True,
    parse_bool,
    "Abort the later of two concurrent upserts (or insert_overwrites) that inserted the same new record "
    "key into one partition through different file groups; false keeps Hudi's behaviour (both commit).",
)

CLUSTERING_UPDATES_STRATEGY = ConfigKey(
    "hoodie.clustering.updates.strategy", "allow", lambda v: _clustering_priority(v),
    "Who wins when ingestion and clustering touch the same file groups: allow (ingestion first: a pending "
    "clustering aborts, a completed one is reverted) or reject (clustering first: the ingestion aborts). "
    "Hudi's SparkAllowUpdateStrategy / SparkRejectUpdateStrategy class names are accepted.",
)


def _clustering_priority(value: str) -> str:
    lowered = value.strip().lower()
    if lowered in ("allow", "reject"):
        return lowered
    for name in ("allow", "reject"):
        if lowered.endswith(f"spark{name}updatestrategy"):
            return name
    raise ValueError(f"{value!r} is neither allow nor reject")

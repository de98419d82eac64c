"""Build the table lock a configuration asks for (``hoodie.write.lock.*``).

Hudi's lock provider class names are accepted as names of the matching provider, so a Hudi writer's
options work unchanged. Only the ZooKeeper lock is shared with Hudi's Java writers (same node, Curator's
node naming); Hudi's ``FileSystemBasedLockProvider`` keeps a different lock file than
:class:`~cowrite.protocol.locks.filesystem.FileSystemLock`, so Java and cowrite writers must not rely on
the filesystem lock to exclude each other.
"""

from __future__ import annotations

from cowrite.errors import ConfigError
from cowrite.format.config import (
    LOCK_MAX_RETRY_WAIT_MS,
    LOCK_PROVIDER,
    LOCK_RETRY_WAIT_MS,
    LOCK_STANDING_ADDRESS,
    LOCK_STANDING_IDLE_MS,
    LOCK_STANDING_MS,
    LOCK_WAIT_MS,
    ZK_BASE_PATH,
    ZK_CONNECTION_TIMEOUT_MS,
    ZK_LOCK_KEY,
    ZK_PORT,
    ZK_SESSION_TIMEOUT_MS,
    ZK_URL,
    Config,
)
from cowrite.protocol.heartbeat import HeartbeatPolicy
from cowrite.protocol.locks.base import InProcessLock, LockHolder, Standing, TableLock
from cowrite.protocol.locks.filesystem import FileSystemLock
from cowrite.protocol.retry import RetryPolicy
from cowrite.storage.backend import Storage

FILESYSTEM = "filesystem"
ZOOKEEPER = "zookeeper"
IN_PROCESS = "in-process"

_HUDI_PACKAGE = "org.apache.hudi.client.transaction.lock"
PROVIDERS: dict[str, str] = {
    FILESYSTEM: FILESYSTEM,
    ZOOKEEPER: ZOOKEEPER,
    IN_PROCESS: IN_PROCESS,
    f"{_HUDI_PACKAGE}.FileSystemBasedLockProvider": FILESYSTEM,
    f"{_HUDI_PACKAGE}.ZookeeperBasedLockProvider": ZOOKEEPER,
    f"{_HUDI_PACKAGE}.InProcessLockProvider": IN_PROCESS,
}


def provider_name(config: Config) -> str:
    """The short provider name (filesystem, zookeeper, in-process) ``config`` selects; else ConfigError."""
    value = config.get(LOCK_PROVIDER).strip()
    provider = PROVIDERS.get(value) or PROVIDERS.get(value.lower())
    if provider is None:
        raise ConfigError(
            f"unknown lock provider {value!r} in {LOCK_PROVIDER.key}; choose one of: {', '.join(PROVIDERS)}"
        )
    return provider


def retry_policy(config: Config) -> RetryPolicy:
    """The retry policy of lock acquisition: total wait and the pauses between tries."""
    wait, first, longest = (config.get(k) for k in (LOCK_WAIT_MS, LOCK_RETRY_WAIT_MS, LOCK_MAX_RETRY_WAIT_MS))
    for key, value in ((LOCK_WAIT_MS, wait), (LOCK_RETRY_WAIT_MS, first), (LOCK_MAX_RETRY_WAIT_MS, longest)):
        if value < 0:
            raise ConfigError(f"{key.key} must not be negative, not {value}: {key.doc}")
    return RetryPolicy(deadline=wait / 1000, delay=first / 1000, max_delay=max(first, longest) / 1000)


def standing(storage: Storage, config: Config) -> Standing | None:
    """How a writer's turn of the filesystem lock stands (:mod:`cowrite.protocol.standing`): on an object
    store, unless ``cowrite.lock.standing.ms`` is 0; else ConfigError."""
    most, idle = config.get(LOCK_STANDING_MS), config.get(LOCK_STANDING_IDLE_MS)
    address = config.get(LOCK_STANDING_ADDRESS).strip()
    if most < 0 or idle <= 0 or not address:
        raise ConfigError(
            f"{LOCK_STANDING_MS.key} must be 0 or more, {LOCK_STANDING_IDLE_MS.key} more than 0, and "
            f"{LOCK_STANDING_ADDRESS.key} an address"
        )
    return Standing(most / 1000, idle / 1000, address) if most and storage.round_trips else None


def zookeeper_hosts(url: str, default_port: int) -> str:
    """``url``'s comma-separated hosts, each with a port (``default_port`` where it has none).

    IPv6 addresses take brackets when they carry a port: ``[::1]:2181``.
    """
    hosts = []
    for host in (part.strip() for part in url.split(",")):
        if not host:
            continue
        if host.startswith("["):
            has_port = "]:" in host
        else:
            has_port = host.count(":") == 1
            if host.count(":") > 1:
                host = f"[{host}]"
        if has_port:
            port = host.rsplit(":", 1)[1]
            if not port.isdigit():
                raise ConfigError(f"bad port {port!r} in {ZK_URL.key}={url!r}: {ZK_URL.doc}")
        hosts.append(host if has_port else f"{host}:{default_port}")
    if not hosts:
        raise ConfigError(f"{ZK_URL.key} names no ZooKeeper host; the zookeeper lock provider needs one")
    return ",".join(hosts)


def lock_for(
    storage: Storage, config: Config, holder: LockHolder, heartbeat: HeartbeatPolicy, table_name: str
) -> TableLock:
    """The lock ``config`` selects for the table at ``storage`` named ``table_name``.

    Raises :class:`ConfigError` for an unknown provider, a malformed setting, or a ZooKeeper lock without
    kazoo installed.
    """
    provider = provider_name(config)
    retry = retry_policy(config)
    if provider == IN_PROCESS:
        return InProcessLock(storage.uri, holder, retry)
    if provider == FILESYSTEM:
        lock = FileSystemLock(storage, holder, heartbeat, retry)
        lock.standing = standing(storage, config)
        return lock
    try:
        from cowrite.protocol.locks.zookeeper import ZooKeeperLock
    except ImportError as exc:
        raise ConfigError(
            f"{LOCK_PROVIDER.key}={config.get(LOCK_PROVIDER)} needs kazoo: `pip install cowrite[zookeeper]` "
            f"({exc})"
        ) from None
    base = config.get(ZK_BASE_PATH)
    if not base.startswith("/"):
        raise ConfigError(f"{ZK_BASE_PATH.key} must be an absolute node path, not {base!r}")
    base = base.rstrip("/")
    key = config.get(ZK_LOCK_KEY) or table_name
    if not key or "/" in key:
        raise ConfigError(
            f"ZooKeeper lock key {key!r} is not a node name; set {ZK_LOCK_KEY.key} or give the table a name"
        )
    return ZooKeeperLock(
        zookeeper_hosts(config.get(ZK_URL), config.get(ZK_PORT)),
        f"{base}/{key}",
        holder,
        retry,
        session_timeout=config.get(ZK_SESSION_TIMEOUT_MS) / 1000,
        connection_timeout=config.get(ZK_CONNECTION_TIMEOUT_MS) / 1000,
    )

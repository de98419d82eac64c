"""Long-running commands: the daemon, and the demo."""

from __future__ import annotations

from collections.abc import Sequence

import click

from cowrite.cli.common import cli, fail
from cowrite.errors import (
    CowriteError,
)


@cli.command()
@click.argument("tables", nargs=-1)
@click.option(
    "--config", "config_path", help="TOML configuration (see the README); tables may also be arguments."
)
@click.option("--host", help="Address to bind (default 127.0.0.1).")
@click.option("--port", type=int, help="HTTP port for /metrics, /healthz, /readyz and /api (default 9464).")
@click.option("--poll-interval", type=float, help="Seconds between looks at timelines, heartbeats, locks.")
@click.option("--clean-interval", type=float, help="Seconds between cleaner runs.")
@click.option("--commits-retained", type=int, help="Commits whose file versions cleaning keeps.")
@click.option("--log-level", default="INFO", show_default=True)
def daemon(
    tables: Sequence[str],
    config_path: str | None,
    host: str | None,
    port: int | None,
    poll_interval: float | None,
    clean_interval: float | None,
    commits_retained: int | None,
    log_level: str,
) -> None:
    """Serve tables: follow timelines, expire stale locks, roll back failed writes, clean, export metrics.

    SIGTERM or SIGINT drains (running jobs finish) and exits 0.
    """
    from cowrite import process, shutdown
    from cowrite.daemon.config import DaemonConfig
    from cowrite.daemon.logs import configure
    from cowrite.daemon.service import Daemon

    stop = shutdown.catch()  # the entry point caught them already; a request made since is kept
    process.few_malloc_arenas()  # polling threads, for as long as it runs
    configure(log_level.upper())
    try:
        config = DaemonConfig.load(
            config_path,
            tables,
            host=host,
            port=port,
            poll_interval=poll_interval,
            clean_interval=clean_interval,
            commits_retained=commits_retained,
        )
        service = Daemon(config)
        if not stop.is_set():  # asked to stop while starting: there is nothing to drain
            service.start()
    except (CowriteError, OSError) as exc:
        fail(exc)
    stop.wait()
    service.stop()


@cli.command()
@click.option("--path", help="Where to create the demo table (default: a new temporary directory).")
def demo(path: str | None) -> None:
    """Show a streaming ingestion killed and restarted beside a backfill, a conflict, a killed writer rolled
    back by the daemon, and consumers that read every commit once, on a local table."""
    from cowrite.demo import run

    run(path)



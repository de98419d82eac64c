"""``python -m bench.chaos --seed N --scenarios K [--long]``: run the harness, print the counts.

Exits 1 if any invariant was violated (the scenarios' directories are kept and named), 0 otherwise.
``--only I [I ...]`` replays single scenarios of the same seed. ``--soak --faults F`` runs seeds of the
soak profile (or of ``--profile``) in parallel until F faults were injected (``soak.py``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from . import PROFILES, run
from .soak import soak


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, help="seed of the run (default: random, printed)")
    parser.add_argument("--scenarios", type=int, help="how many scenarios (default 5; a soak: 10 a seed)")
    parser.add_argument("--long", action="store_true", help="bigger scenarios, S3 (moto) among them")
    parser.add_argument(
        "--profile",
        choices=sorted(PROFILES),
        help="quick (default), long (as --long), soak: half the scenarios on S3, two thirds of those "
        "behind 20 or 50 ms round trips, starvation, calm scenarios, more storage faults; or crowd: as the "
        "soak, all on S3 behind round trips, 6-8 writers (group commit)",
    )
    parser.add_argument("--json", type=Path, help="also write the report here, as JSON")
    soaking = parser.add_argument_group("soak")
    soaking.add_argument("--soak", action="store_true", help="run seeds in parallel until --faults/--minutes")
    soaking.add_argument("--faults", type=int, default=10_000, help="faults to inject in all (default 10000)")
    soaking.add_argument("--minutes", type=float, help="and start no seed after this many minutes")
    soaking.add_argument("--parallel", type=int, default=os.cpu_count() or 2, help="seeds at once (cores)")
    parser.add_argument("--only", type=int, nargs="+", help="replay only these scenario numbers")
    parser.add_argument("--local-only", action="store_true", help="no S3 scenarios")
    parser.add_argument("--workdir", type=Path, help="keep tables and logs here (default: a temporary dir)")
    parser.add_argument("--keep", action="store_true", help="keep every scenario's directory")
    parser.add_argument("--verbose", action="store_true", help="log cowrite's warnings of this process")
    parser.add_argument(
        "--unsafe-window",
        action="store_true",
        help="also stop writers between their last lease check and publishing, the one window "
        "leases cannot close: expect violations of invariant 4 (and what follows)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING if args.verbose else logging.CRITICAL,
        format="%(name)s %(levelname)s %(message)s",
    )
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 10**6)
    if args.soak:
        workdir = args.workdir or Path(tempfile.mkdtemp(prefix="cowrite-soak-"))
        profile = args.profile or "soak"
        return soak(args.faults, args.minutes, args.parallel, seed, args.scenarios or 10, workdir, profile)
    args.scenarios = args.scenarios or 5
    name = args.profile or ("long" if args.long else "quick")
    mode = name + (", unsafe window" if args.unsafe_window else "")
    print(
        f"cowrite chaos: seed {seed}, {args.scenarios} scenarios ({mode}), {os.cpu_count()} cpus", flush=True
    )
    started = time.monotonic()
    profile = PROFILES[name]
    if args.unsafe_window:
        profile = replace(profile, unsafe=True)
    report = run(
        seed,
        args.scenarios,
        profile,
        only=args.only,
        workdir=args.workdir,
        keep=args.keep,
        backends=("local",) if args.local_only else ("local", "s3"),
        progress=lambda line: print(line, flush=True),
    )
    print(report.summary())
    if args.json:
        args.json.write_text(json.dumps(report.to_json()))
    print(
        f"took {time.monotonic() - started:.0f} s; replay: python -m bench.chaos --seed {seed} "
        f"--scenarios {args.scenarios} --profile {name}"
        f"{' --unsafe-window' if args.unsafe_window else ''}"
        + (
            ""
            if not report.violations
            else f" --only {' '.join(str(r.scenario.index) for r in report.results if r.violations)}"
        )
    )
    return 1 if report.violations else 0


if __name__ == "__main__":
    sys.exit(main())

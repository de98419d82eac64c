"""``python -m cowrite.held_write RELEASE ARGS...``: ``cowrite write ARGS``, held once every file is
written (:data:`~cowrite.steps.Step.WRITTEN`) until the file ``RELEASE`` exists — the demo's long backfill,
stopped where the demo needs it. A module of its own so that the demo, which the CLI imports, does not
import the CLI back.
"""

import sys
from pathlib import Path

from cowrite import steps
from cowrite.cli import main

if __name__ == "__main__":
    steps.observe_forever(steps.Pause(steps.Step.WRITTEN, release=Path(sys.argv[1])))
    sys.argv = ["cowrite", "write", *sys.argv[2:]]
    main()

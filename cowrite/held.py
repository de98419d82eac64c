"""``python -m cowrite.held STEP FILE COMMAND ARGS...``: ``cowrite COMMAND ARGS``, held at a step of its
write — the demo's long backfill and its stream, stopped where the demo needs them.

At ``written`` (every file written, the commit not begun) it waits until the file FILE exists, then goes
on. At ``published`` (the completed instant exists, the lock still held) it writes FILE and waits to be
killed. A module of its own so that the demo, which the CLI imports, does not import the CLI back.
"""

import sys
from pathlib import Path

from cowrite import steps
from cowrite.cli import main

if __name__ == "__main__":
    step, file = steps.Step(sys.argv[1]), Path(sys.argv[2])
    if step is steps.Step.PUBLISHED:
        pause = steps.Pause(step, ready=file)
    else:
        pause = steps.Pause(step, release=file)
    steps.observe_forever(pause)
    sys.argv = ["cowrite", *sys.argv[3:]]
    main()

"""Import paths of earlier releases (``cowrite.timeline.table``, ``cowrite.timeline.errors``); new code
imports :mod:`cowrite`."""

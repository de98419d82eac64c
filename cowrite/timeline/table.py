"""Moved to :mod:`cowrite.format.table`; this path, documented by earlier releases, keeps working."""

import sys

from cowrite.format import table as _moved

sys.modules[__name__] = _moved

"""Moved to :mod:`cowrite.engine.clustering`; this path, documented by earlier releases, keeps working."""

import sys

from cowrite.engine import clustering as _moved

sys.modules[__name__] = _moved

"""Moved to :mod:`cowrite.local.read`; this path, documented by earlier releases, keeps working."""

import sys

from cowrite.local import read as _moved

sys.modules[__name__] = _moved

"""Moved to :mod:`cowrite.local.writer`; this path, documented by earlier releases, keeps working."""

import sys

from cowrite.local import writer as _moved

sys.modules[__name__] = _moved

"""Moved to :mod:`cowrite.errors`; this path, documented by earlier releases, keeps working."""

import sys

from cowrite import errors as _moved

sys.modules[__name__] = _moved

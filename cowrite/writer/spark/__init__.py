"""Moved to :mod:`cowrite.spark`; this path, documented by earlier releases, keeps working."""

import sys

import cowrite.spark as _moved

sys.modules[__name__] = _moved

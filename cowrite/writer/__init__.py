"""Import paths of earlier releases (``cowrite.writer.local``, ``.read``, ``.clustering``, ``.spark``); new
code imports :mod:`cowrite` and :mod:`cowrite.spark`."""

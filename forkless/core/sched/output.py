"""Moved to :mod:`forkless.protocol.step`. Importing this old path gives that very module, so code (and
plugins) written against it keep working and see the same classes."""

import sys

import forkless.protocol.step

sys.modules[__name__] = forkless.protocol.step

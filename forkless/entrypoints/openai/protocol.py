"""Moved to :mod:`forkless.protocol.openai`. Importing this old path gives that very module, so code (and
plugins) written against it keep working and see the same classes."""

import sys

import forkless.protocol.openai

sys.modules[__name__] = forkless.protocol.openai

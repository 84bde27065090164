"""Import a plugin given as a ``.py`` file path or a module name (``--tool-parser-plugin``)."""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from types import ModuleType

from forkless.plugins._registry import PluginImportError
from forkless.utils.import_utils import import_from_path


def import_module_or_file(spec: str, what: str) -> ModuleType:
    """Import ``spec``, running whatever registrations the module makes at import time.

    Args:
        spec: A path to a ``.py`` file, or an importable module name.
        what: The option that named it, for messages (``"--tool-parser-plugin"``).

    Returns:
        The imported module.

    Raises:
        PluginImportError: The file is missing or the import raised; the message carries
            the plugin's traceback, since the user has to fix their own code.
    """
    is_file = spec.endswith(".py") or os.sep in spec
    try:
        if not is_file:
            return importlib.import_module(spec)
        path = os.path.abspath(os.path.expanduser(spec))
        if not os.path.isfile(path):
            raise PluginImportError(f"{what} {spec}: no such file")
        # A stable, file-specific module name, so importing the same file twice is a no-op.
        name = "_forkless_plugin_" + os.path.splitext(os.path.basename(path))[0]
        if name in sys.modules and getattr(sys.modules[name], "__file__", None) == path:
            return sys.modules[name]
        try:
            return import_from_path(name, path)
        except ModuleNotFoundError as exc:
            if exc.name != name:  # the plugin's own import failed: reported below, with its traceback
                raise
            raise PluginImportError(f"{what} {spec}: cannot load this file as a Python module") from None
    except PluginImportError:
        raise
    except Exception as exc:
        raise PluginImportError(
            f"{what} {spec} failed to import: {type(exc).__name__}: {exc}\n{traceback.format_exc()}"
        ) from exc

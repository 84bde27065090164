"""vLLM's ``vllm.utils.import_utils``: importing a module from a file (as
``--tool-parser-plugin FILE`` does), and an object by its qualified name."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any


def import_from_path(module_name: str, file_path: str | Path) -> ModuleType:
    """Import the Python file ``file_path`` as the module ``module_name`` (registered in
    ``sys.modules`` under that name).

    Raises:
        ModuleNotFoundError: The file cannot be loaded as a module (its ``name`` is
            ``module_name``); what the module raises while it runs propagates.
    """
    spec = importlib.util.spec_from_file_location(module_name, file_path)
    if spec is None or spec.loader is None:
        raise ModuleNotFoundError(f"no module named {module_name!r} at {file_path}", name=module_name)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    return module


def resolve_obj_by_qualname(qualname: str) -> Any:
    """The object ``qualname`` (``"pkg.mod.Class"``) names, as vLLM resolves class paths.

    Raises:
        ValueError: ``qualname`` has no dot.
        ModuleNotFoundError / AttributeError: No such module, or no such name in it.
    """
    module_name, dot, name = qualname.rpartition(".")
    if not dot:
        raise ValueError(f"{qualname!r} is not a qualified name: expected 'package.module.Name'")
    return getattr(importlib.import_module(module_name), name)

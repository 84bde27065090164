"""vLLM's ``vllm.utils.import_utils``: importing a module from a file (as
``--tool-parser-plugin FILE`` does)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


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

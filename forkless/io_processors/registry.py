"""Finding the IO processor that ``--io-processor-plugin NAME`` selects."""

from __future__ import annotations

import inspect
from typing import Any

from forkless.io_processors.interface import IOProcessor
from forkless.logger import init_logger
from forkless.plugins import IO_PROCESSOR_PLUGINS_GROUP, call_plugin, load_plugins_by_group, resolve_class

logger = init_logger(__name__)


def get_io_processor(config: Any, plugin_name: str | None) -> IOProcessor | None:
    """Build the selected IO processor.

    Args:
        config: The engine configuration, passed to the processor.
        plugin_name: The entry-point name of a ``forkless.io_processor_plugins`` plugin
            (``--io-processor-plugin``); ``None``: no processor.

    Returns:
        The processor, or ``None`` when none was asked for.

    Raises:
        ValueError: No such plugin is installed (the message lists those that are), it
            returned ``None`` (it does not apply here) or failed, or its class is not an
            ``IOProcessor``.
    """
    if plugin_name is None:
        return None
    loaded = load_plugins_by_group(IO_PROCESSOR_PLUGINS_GROUP)
    if plugin_name not in loaded:
        raise ValueError(f"--io-processor-plugin {plugin_name!r}: no such plugin in the {IO_PROCESSOR_PLUGINS_GROUP} "
                         f"entry-point group (installed and allowed: {sorted(loaded) or 'none'})")
    func = loaded[plugin_name]
    if not callable(func):
        raise ValueError(f"--io-processor-plugin {plugin_name!r}: the entry point is {type(func).__name__}, not a "
                         "zero-argument callable returning an IOProcessor class path")
    ok, path = call_plugin(IO_PROCESSOR_PLUGINS_GROUP, plugin_name, func)
    if not ok:
        raise ValueError(f"--io-processor-plugin {plugin_name!r}: the plugin raised (see the log)")
    if path is None:
        raise ValueError(f"--io-processor-plugin {plugin_name!r}: the plugin returned None (it does not apply to "
                         "this server)")
    cls = resolve_class(path, IOProcessor, "--io-processor-plugin")
    if cls.parse_data is IOProcessor.parse_data and not callable(getattr(cls, "parse_request", None)):
        # Found now, not as every request's error.
        raise ValueError(f"--io-processor-plugin {plugin_name!r}: {path} implements neither parse_data(data) nor "
                         "vLLM's earlier parse_request(request)")
    logger.info("IO processor plugin %r: %s", plugin_name, path)
    # vLLM's processors take (vllm_config, renderer); its earlier ones, and some written
    # for forkless, only the configuration.
    try:
        inspect.signature(cls).bind(config, None)
    except TypeError:
        return cls(config)
    return cls(config, None)

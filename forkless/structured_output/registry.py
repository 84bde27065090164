"""``StructuredOutputBackendRegistry``: structured-output backends by name, imported on
first use.

``--structured-outputs-config``'s ``backend`` is a name registered here (the built-in
``xgrammar`` and ``guidance``, or one a general plugin registers with
:meth:`StructuredOutputBackendRegistry.register`), ``auto``, or a ``pkg.mod:Class`` path;
an unknown name is an error listing the available ones.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import msgspec

from forkless.plugins import LazyRegistry, canonical_path, import_path
from forkless.structured_output.interface import StructuredOutputBackend

if TYPE_CHECKING:
    from forkless.sampling_params import StructuredOutputsParams
    from forkless.structured_output.config import StructuredOutputsConfig

_BUILTIN_BACKENDS = {
    "xgrammar": "forkless.structured_output.backend_xgrammar:XgrammarBackend",
    "guidance": "forkless.structured_output.backend_guidance:GuidanceBackend",
}

#: Tried in this order by ``"backend": "auto"`` (as vLLM's auto: xgrammar, else guidance).
AUTO_ORDER = ("xgrammar", "guidance")


class _StructuredOutputBackendRegistry:
    """Named structured-output backends (provisional tier)."""

    def __init__(self) -> None:
        self._registry: LazyRegistry[type[StructuredOutputBackend]] = LazyRegistry(
            "structured-output backend", StructuredOutputBackend,
            "Register one with forkless.structured_output.StructuredOutputBackendRegistry.register(name, "
            "'pkg.mod:Class') from a general plugin, give its class path as 'backend', or use 'auto'.")
        for name, path in _BUILTIN_BACKENDS.items():
            self._registry.register(name, path)

    def register(self, name: str, backend: Any) -> None:
        """Register a backend under ``name`` (a ``StructuredOutputBackend`` subclass or its path)."""
        if name == "auto":
            raise ValueError("'auto' is not a backend name that can be registered: it picks among the others")
        self._registry.register(name, backend)

    def names(self) -> list[str]:
        """The registered names, sorted (``auto`` is not one of them)."""
        return sorted(self._registry.names())

    def resolve(self, name: str) -> type[StructuredOutputBackend]:
        """The class for ``name``: a registered name, else a ``pkg.mod:Class`` path.

        Raises:
            forkless.plugins.RegistryError: An unknown name (the message lists the
                available ones, ``auto`` included).
            forkless.plugins.PluginImportError: A path that does not import.
            TypeError: It is not a ``StructuredOutputBackend`` subclass.
        """
        if name in self._registry or (":" not in name and "." not in name):
            from forkless.plugins import RegistryError

            try:
                return self._registry.resolve(name)
            except RegistryError:
                raise RegistryError(
                    f"unknown structured-output backend {name!r}; available: auto, {', '.join(self.names())}, "
                    "or a StructuredOutputBackend class path pkg.mod:Class") from None
        cls = import_path(canonical_path(name))
        if not (isinstance(cls, type) and issubclass(cls, StructuredOutputBackend)):
            raise TypeError(f"structured-output backend {name!r} is {cls!r}, not a "
                            "forkless.structured_output.StructuredOutputBackend subclass")
        return cls


StructuredOutputBackendRegistry = _StructuredOutputBackendRegistry()


def check_backend(name: str) -> None:
    """Fail now, at start-up, for a backend that does not resolve (``auto`` always does).

    Raises:
        ValueError: Unknown name (listing the available ones), a path that does not
            import, or a class of the wrong type.
    """
    if name == "auto":
        return
    from forkless.plugins import PluginImportError, RegistryError

    try:
        StructuredOutputBackendRegistry.resolve(name)
    except RegistryError as exc:
        raise ValueError(f"--structured-outputs-config: {exc.args[0]}") from None
    except (PluginImportError, TypeError) as exc:
        raise ValueError(f"--structured-outputs-config: backend {name!r}: {exc}") from None


#: Answers of choose_backend remembered: (backend setting, disable_fallback, digest of the
#: params) -> ("ok", backend) or ("error", message); the last 256.
_ANSWERS = 256
_answers: OrderedDict[tuple[str, bool, bytes], tuple[str, str]] = OrderedDict()
_answers_lock = threading.Lock()


def choose_backend(params: StructuredOutputsParams, config: StructuredOutputsConfig) -> str:
    """Check a request's constraint and pick the backend that compiles it (``auto``:
    the first of :data:`AUTO_ORDER` that accepts it, unless ``disable_fallback``).

    Torch-free: runs in the API server and offline before the request is queued. The
    answer for the last 256 constraints is remembered, by a digest of the params:
    checking one can take a second or more (llguidance builds the grammar: 50,000
    choices), an application sends the same ``response_format`` with every request, and
    the API server checks each request's constraint in a thread first, so that the check
    that ``Processor.process_inputs`` repeats on the event loop is a lookup. Thread-safe.

    Returns:
        The backend's name (or class path), recorded in the params for the engine core.

    Raises:
        ValueError: No backend accepts it; the message names the problem.
    """
    key = (config.backend, bool(config.disable_fallback),
           hashlib.blake2b(msgspec.msgpack.encode(params), digest_size=16).digest())
    with _answers_lock:
        found = _answers.get(key)
        if found is not None:
            _answers.move_to_end(key)
    if found is None:
        try:
            found = ("ok", _choose_backend(params, config))
        except ValueError as exc:
            found = ("error", str(exc))
        with _answers_lock:
            _answers[key] = found
            if len(_answers) > _ANSWERS:
                _answers.popitem(last=False)
    outcome, value = found
    if outcome == "error":
        raise ValueError(value)
    return value


def _choose_backend(params: StructuredOutputsParams, config: StructuredOutputsConfig) -> str:
    if config.backend != "auto":
        StructuredOutputBackendRegistry.resolve(config.backend).validate_params(params)
        return config.backend
    no_fallback = params.disable_fallback or config.disable_fallback
    errors: list[tuple[str, ValueError]] = []
    for name in AUTO_ORDER:
        try:
            StructuredOutputBackendRegistry.resolve(name).validate_params(params)
            return name
        except ValueError as exc:
            errors.append((name, exc))
            if no_fallback:
                break
    if len(errors) == 1:
        raise errors[0][1]
    # Each backend's own reason: the first one's alone would advise what the next refused.
    raise ValueError("no structured-outputs backend takes this constraint: "
                     + "; ".join(f"{name}: {exc}" for name, exc in errors))

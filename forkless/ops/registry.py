"""The custom-op registry: op name -> in-tree class, and the out-of-tree replacement of each.

Invariants:
    * Torch-free: a platform registers its replacements from ``pre_register_and_update``,
      which runs in every process, the API server included (it never imports torch), so
      replacements are registered by class path here and imported only where an op of
      that name is built.
    * A replacement names an op that exists: an unknown name is an error listing the op
      names there are. (vLLM stores any name and never uses a misspelt one, so a typo
      there silently leaves the in-tree op running.) vLLM's spelling, the in-tree class
      name (``"RMSNorm"``), is accepted for the op name (``"rms_norm"``), so ported
      platforms register unchanged.
    * One replacement per name: the same target again is a no-op (plugins run once per
      process), a different one wins with a warning, as in every forkless registry.
    * Lookups happen when an op is built (:class:`forkless.ops.CustomOp`), never per call.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

from forkless.plugins import LazyRegistry, RegistryError, canonical_path

# The in-tree ops, by vLLM's op names; imported only where a model builds them.
_BUILTIN_OPS = {
    "rms_norm": "forkless.ops.layernorm:RMSNorm",
    "rotary_embedding": "forkless.ops.rotary:RotaryEmbedding",
    "silu_and_mul": "forkless.ops.activation:SiluAndMul",
}

_HINT = ("Replace one with forkless.ops.register_oot(name, 'pkg.mod:Class') from a platform's "
         "pre_register_and_update, or @CustomOp.register_oot(name) on the class.")

_in_tree: LazyRegistry[type] = LazyRegistry("custom op", hint=_HINT)
_oot: LazyRegistry[type] = LazyRegistry("out-of-tree custom op", hint=_HINT)
# In-tree class name -> op name ("RMSNorm" -> "rms_norm"): the names vLLM platforms use.
_class_names: dict[str, str] = {}
# ``--compilation-config``'s ``custom_ops`` while the model runner builds its models
# (using_custom_ops); None: FORKLESS_CUSTOM_OPS's.
_custom_ops: list[str] | None = None


@contextmanager
def using_custom_ops(entries: list[str] | None) -> Iterator[None]:
    """Which custom ops run their device implementation, for the ops built inside (vLLM's
    ``compilation_config.custom_ops``: ``"all"``, ``"none"``, ``"+op"``, ``"-op"``);
    ``None`` leaves it to ``FORKLESS_CUSTOM_OPS``. (Ops choose when built, so the setting
    is only needed while a model is built; another engine in the process is unaffected.)"""
    global _custom_ops
    saved, _custom_ops = _custom_ops, None if entries is None else list(entries)
    try:
        yield
    finally:
        _custom_ops = saved


def custom_ops_setting() -> tuple[str, str]:
    """``(the comma-separated entries in force, where they come from)``, for :func:`op_enabled`."""
    from forkless import envs

    if _custom_ops is not None:
        return ",".join(_custom_ops), "--compilation-config custom_ops"
    return envs.FORKLESS_CUSTOM_OPS, "FORKLESS_CUSTOM_OPS"


def _path_of(target: Any) -> str:
    if isinstance(target, str):
        return canonical_path(target)
    return f"{target.__module__}:{target.__qualname__}"


def _class_name(path: str) -> str:
    return path.rsplit(":", 1)[-1].rsplit(".", 1)[-1]


def register_op(name: str, op: Any) -> None:
    """Register an in-tree op under ``name`` (what ``@CustomOp.register(name)`` does).

    Args:
        name: The op name (``"rms_norm"``).
        op: The :class:`~forkless.ops.CustomOp` subclass, or its ``"pkg.mod:Class"`` path.

    Raises:
        ValueError: ``name`` already names another class; to replace an op use
            :func:`register_oot`.
    """
    if name in _in_tree:
        old = _in_tree.get_path(name) or _path_of(_in_tree.resolve(name))
        if old != _path_of(op):
            raise ValueError(f"custom op {name!r} is already {old}; replace it with "
                             f"forkless.ops.register_oot({name!r}, ...) instead of registering it again")
        return  # the class of the registered path (its module is being imported)
    _in_tree.register(name, op)
    _class_names.setdefault(_class_name(_path_of(op)), name)


def op_name(name: str) -> str:
    """The op name ``name`` stands for: itself, or the name of the in-tree class it names.

    Raises:
        forkless.plugins.RegistryError: No in-tree op has that name or class name; the
            message lists the op names.
    """
    if name in _in_tree:
        return name
    if name in _class_names:
        return _class_names[name]
    raise RegistryError(f"unknown custom op {name!r}; custom ops: "
                        f"{', '.join(op_names())} (or their class names: "
                        f"{', '.join(sorted(_class_names))})")


def register_oot(name: str, op: Any) -> str:
    """Make ``op`` replace the in-tree op ``name`` wherever a model builds one.

    Args:
        name: An op name (``"rms_norm"``) or its in-tree class name (``"RMSNorm"``, vLLM's).
        op: A subclass of the in-tree op's class (checked when first built), or its
            ``"pkg.mod:Class"`` path, imported only where an op of that name is built.

    Returns:
        The op name.

    Raises:
        forkless.plugins.RegistryError: No in-tree op has that name; the message lists
            the op names.
    """
    name = op_name(name)
    old = _oot.get_path(name)
    if old is not None and not isinstance(op, str) and old == _path_of(op):
        return name  # the class of the path already registered (its module is importing)
    _oot.register(name, op)
    return name


def op_enabled(name: str | None, custom_ops: str, default: bool, source: str = "FORKLESS_CUSTOM_OPS") -> bool:
    """Whether op ``name`` runs its device implementation (else ``forward_native``).

    vLLM's ``custom_ops`` rules: ``+op`` turns an op on, ``-op`` off, ``none`` turns off
    every op not named with ``+``, ``all`` turns on every op not named with ``-``.

    Args:
        name: The op name; None for an op that is not registered (only ``all`` / ``none``
            and the default apply).
        custom_ops: Comma-separated ``all``, ``none``, ``+op``, ``-op`` (op names or their
            class names).
        default: Whether ops are on when ``custom_ops`` names neither ``all`` nor ``none``
            (``FORKLESS_FUSED_KERNELS``).
        source: Where ``custom_ops`` comes from, for the messages.

    Raises:
        ValueError: An entry of another form, an unknown op name (the message lists the op
            names), ``all`` with ``none``, or one op both on and off.
    """
    on: set[str] = set()
    off: set[str] = set()
    entries = [e.strip() for e in custom_ops.split(",") if e.strip()]
    for entry in entries:
        if entry in ("all", "none"):
            continue
        if entry[0] not in "+-" or len(entry) == 1:
            raise ValueError(f"{source}={custom_ops!r}: {entry!r} is not 'all', 'none', "
                             f"'+op' or '-op'; custom ops: {', '.join(op_names())}")
        try:
            (on if entry[0] == "+" else off).add(op_name(entry[1:]))
        except RegistryError as err:
            raise ValueError(f"{source}={custom_ops!r}: {err.args[0]}") from None
    if "all" in entries and "none" in entries:
        raise ValueError(f"{source}={custom_ops!r} says both 'all' and 'none'")
    if on & off:
        raise ValueError(f"{source}={custom_ops!r} turns {', '.join(sorted(on & off))} "
                         "both on and off")
    if "all" in entries:
        default = True
    elif "none" in entries:
        default = False
    return (default or name in on) and name not in off


def unregister_oot(name: str) -> None:
    """Drop the replacement of ``name`` (ops built afterwards are in-tree again)."""
    _oot.unregister(op_name(name))


def op_names() -> list[str]:
    """The in-tree op names, sorted."""
    return _in_tree.names()


def oot_ops() -> dict[str, str]:
    """The registered replacements, ``{op name: "pkg.mod:Class"}`` (nothing is imported)."""
    return {name: _oot.get_path(name) or _path_of(_oot.resolve(name)) for name in _oot.names()}


def op_class(name: str) -> type:
    """The in-tree class of op ``name`` (imported on first use).

    Raises:
        forkless.plugins.RegistryError: Unknown name; the message lists the op names.
    """
    return _in_tree.resolve(op_name(name))


def oot_op_class(name: str) -> type | None:
    """The replacement registered for op ``name`` (imported on first use), or None."""
    return _oot.resolve(name) if name in _oot else None


for _name, _path in _BUILTIN_OPS.items():
    register_op(_name, _path)

"""``CustomOp``: a layer operation with one implementation per kind of device (provisional tier).

Invariants:
    * The implementation is chosen once, when the op is built, never per call: the
      current platform picks ``forward_cpu`` (CPU), ``forward_cuda`` (CUDA),
      ``forward_oot`` (an out-of-tree platform) or ``forward_native`` (any other);
      ``FORKLESS_FUSED_KERNELS=0`` picks ``forward_native`` everywhere, and
      ``FORKLESS_CUSTOM_OPS`` per op (``-rms_norm``, ``none,+silu_and_mul``). The chosen bound
      method becomes the instance's ``forward``, so ``nn.Module.__call__`` reaches it with
      no dispatch in between.
    * A device method an op does not override is bound as ``forward_native`` itself, not
      as a default that forwards to it (one call frame fewer on every call).
    * Building a registered op builds its out-of-tree replacement instead when one is
      registered (:func:`forkless.ops.register_oot`); the replacement subclasses the
      in-tree class, so it takes the same arguments. Subclasses that are not registered
      themselves are never replaced: they are other ops.
    * The platform is resolved before the lookup, so that a platform plugin's
      ``pre_register_and_update`` has registered its replacements by then.
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar

from torch import nn

from forkless import envs
from forkless.ops import registry
from forkless.platforms import get_current_platform
from forkless.plugins import Stability, stability

_DEVICE_METHODS = ("forward_cpu", "forward_cuda", "forward_oot")


@stability(Stability.PROVISIONAL)
class CustomOp(nn.Module):
    """Base class of the layer operations a platform can reimplement (vLLM's ``CustomOp``).

    A subclass implements :meth:`forward_native` (plain PyTorch) and overrides the device
    methods it has kernels for; the signature of all of them is the op's ``forward``.
    Register an in-tree op with ``@CustomOp.register("name")``; replace one from a plugin
    with ``@CustomOp.register_oot("name")`` (or :func:`forkless.ops.register_oot` by path).

    Attributes:
        name: The registered op name (``"rms_norm"``); set by :meth:`register` and
            :meth:`register_oot`, None on an op that is not registered.
    """

    name: ClassVar[str | None] = None

    def __new__(cls, *args: Any, **kwargs: Any) -> CustomOp:
        get_current_platform()  # its pre_register_and_update registers its replacements
        name = cls.__dict__.get("name")
        if name is not None:
            replacement = registry.oot_op_class(name)
            if replacement is not None and replacement is not cls:
                if not (isinstance(replacement, type) and issubclass(replacement, cls)):
                    raise TypeError(f"the out-of-tree replacement of custom op {name!r} is {replacement!r}, "
                                    f"which does not subclass {cls.__module__}.{cls.__qualname__}")
                cls = replacement
        return super().__new__(cls)

    def __init__(self) -> None:
        super().__init__()
        self.bind_forward(self.dispatch_forward())

    def bind_forward(self, method: Callable[..., Any]) -> None:
        """Make ``method`` (a bound method of this op) the one every call runs."""
        self._forward_method = method
        if type(self).forward is CustomOp.forward:
            # An instance attribute shadows the class's forward: nn.Module calls the
            # chosen method directly. (A subclass that overrides forward keeps its own.)
            self.forward = method

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Runs the implementation chosen at construction (normally shadowed by it)."""
        return self._forward_method(*args, **kwargs)

    def forward_native(self, *args: Any, **kwargs: Any) -> Any:
        """The plain PyTorch implementation: the reference, and the fallback everywhere."""
        raise NotImplementedError(f"{type(self).__qualname__} does not implement forward_native")

    def forward_cpu(self, *args: Any, **kwargs: Any) -> Any:
        """The implementation on the CPU platform (default: :meth:`forward_native`)."""
        return self.forward_native(*args, **kwargs)

    def forward_cuda(self, *args: Any, **kwargs: Any) -> Any:
        """The implementation on the CUDA platform (default: :meth:`forward_native`)."""
        return self.forward_native(*args, **kwargs)

    def forward_oot(self, *args: Any, **kwargs: Any) -> Any:
        """The implementation on an out-of-tree platform (default: :meth:`forward_native`)."""
        return self.forward_native(*args, **kwargs)

    @classmethod
    def enabled(cls) -> bool:
        """Whether the op runs its device implementation (False: ``forward_native``).

        ``FORKLESS_FUSED_KERNELS=0`` turns every op's device implementation off by default;
        ``--compilation-config``'s ``custom_ops`` (vLLM's), else ``FORKLESS_CUSTOM_OPS``,
        turns ops on and off by name.

        Raises:
            ValueError: The setting is malformed or names an unknown op.
        """
        custom_ops, source = registry.custom_ops_setting()
        return registry.op_enabled(cls.name, custom_ops, envs.FORKLESS_FUSED_KERNELS, source)

    def dispatch_forward(self) -> Callable[..., Any]:
        """The bound method this op runs, chosen by :meth:`enabled` and the current platform.

        Subclasses may override it to fall back (e.g. to ``forward_native`` where their
        kernels are unavailable); it runs once, in ``__init__``.
        """
        if not self.enabled():
            return self.forward_native
        platform = get_current_platform()
        if platform.is_cpu():
            chosen = "forward_cpu"
        elif platform.is_cuda_alike():
            chosen = "forward_cuda"
        elif platform.is_out_of_tree():
            chosen = "forward_oot"
        else:
            return self.forward_native
        if getattr(type(self), chosen) is getattr(CustomOp, chosen):
            return self.forward_native  # not overridden: skip the default's extra frame
        return getattr(self, chosen)

    @property
    def implementation(self) -> str:
        """The name of the method this op runs (``"forward_cpu"``, ``"forward_native"``...).

        An op built on the CPU before the C kernels were loaded says
        ``"_load_cpu_kernels_then_bind"`` until its first call.
        """
        return self._forward_method.__name__

    @classmethod
    def register(cls, name: str) -> Callable[[type[CustomOp]], type[CustomOp]]:
        """Class decorator: register an in-tree op under ``name``.

        Raises:
            ValueError: ``name`` already names another class (replace ops with
                :meth:`register_oot`).
        """
        def decorator(op_cls: type[CustomOp]) -> type[CustomOp]:
            registry.register_op(name, op_cls)
            op_cls.name = name
            return op_cls

        return decorator

    @classmethod
    def register_oot(cls, _decorated_op_cls: Any = None, name: str | None = None) -> Any:
        """Register an out-of-tree replacement of an in-tree op.

        Every spelling vLLM accepts works: ``@CustomOp.register_oot("rms_norm")``,
        ``@CustomOp.register_oot(name="RMSNorm")``, ``@RMSNorm.register_oot`` (the name
        of the class it is called on), ``CustomOp.register_oot(_decorated_op_cls=C,
        name="rms_norm")``. The name is an op name or its in-tree class name.

        Raises:
            forkless.plugins.RegistryError: No in-tree op has that name; the message lists
                the op names (vLLM would store it and never use it).
            TypeError: The decorated object is not a class.
        """
        if isinstance(_decorated_op_cls, str):  # register_oot("rms_norm")
            _decorated_op_cls, name = None, _decorated_op_cls
        if name is None:
            if cls is CustomOp:
                raise TypeError("CustomOp.register_oot needs the name of the op to replace")
            name = cls.__dict__.get("name", cls.__name__)

        def decorator(op_cls: Any) -> Any:
            if not isinstance(op_cls, type):
                raise TypeError(f"register_oot decorates a class, got {op_cls!r}")
            op_cls.name = registry.register_oot(name, op_cls)
            return op_cls

        return decorator if _decorated_op_cls is None else decorator(_decorated_op_cls)

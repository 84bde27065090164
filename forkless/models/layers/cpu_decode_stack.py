"""A decode step through a Llama-family model's decoder layers in one C call, on the CPU.

The module-by-module forward calls ~15 kernels a layer from Python; at decode batch sizes
their dispatch costs about as much as their work (batch 1, SmolLM2-135M, float32, 2
threads: 26.7 ms a step, 18.9 ms in one call). ``forkless_decode_stack_f32`` and
``forkless_decode_stack_bf16`` (``forkless/cpu_kernels/csrc/decode_stack.c``) run the same
kernels in the same order on the same buffers' values, so a step gives bit-identical hidden
states either way.

Invariants:
    * The stack runs only where that identity holds, and the modules run otherwise:
      float32 or bfloat16; one rank (no tensor or pipeline parallelism); every projection
      exactly a :class:`~forkless.models.layers.cpu_linear.PackedLinear` or a
      :class:`~forkless.models.layers.gguf_linear.GGUFLinear` in float32 (with GGUF layers,
      steps of at most ``KERNEL_MAX_ROWS`` rows, where those run the same C kernel), a
      :class:`~forkless.models.layers.cpu_linear.PackedLinearBF16` in bfloat16 (a LoRA
      wrapper is neither; a model on oneDNN's bfloat16 layers gets no stack); every RMSNorm,
      rotary embedding and SiLU-and-mul forkless's own class bound to ``forward_cpu`` (an
      op a plugin replaced, or one ``FORKLESS_CUSTOM_OPS`` turned off, runs as itself); the
      attention backend exactly
      :class:`~forkless.attention.backends.cpu_paged.CpuAttentionBackend`, its ``forward``
      not hooked (KV connectors hook it); and a step whose every row is one decoding
      sequence's new token, stored at its slot.
    * Which modules qualify is decided once, the first time every op is bound (their
      kernels load on first use), and the weights' addresses are read then: the model's
      modules are not replaced after its first forward (LoRA wraps them before). The
      caches' addresses are re-read whenever the model runner passes other caches.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from forkless import cpu_kernels, envs
from forkless.models.layers.cpu_linear import PackedLinear, PackedLinearBF16
from forkless.models.layers.gguf_linear import KERNEL_MAX_ROWS, GGUFLinear

if TYPE_CHECKING:
    from forkless.attention import AttentionMetadata

_p = ctypes.c_void_p
#: The projection kinds the C table takes (``forkless_projection.format``).
_FORMATS = {"F32": 0, "Q8_0": 1, "Q4_1": 2, "BF16": 3, "Q8_0_I8": 4, "Q4_1_I8": 5}
#: The projection classes each dtype's stack takes, and its C entry point's suffix.
_PROJECTIONS = {torch.float32: (PackedLinear, GGUFLinear), torch.bfloat16: (PackedLinearBF16,)}
_SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16"}


class _Projection(ctypes.Structure):
    _fields_ = [("format", ctypes.c_int), ("out_cols", ctypes.c_int), ("w", _p), ("scales", _p), ("mins", _p),
                ("bias", _p)]


class _Layer(ctypes.Structure):
    _fields_ = [(name, _p) for name in ("input_norm", "post_norm", "q_norm", "k_norm")] + [
        (name, _Projection) for name in ("qkv", "o", "gate_up", "down")] + [("k_cache", _p), ("v_cache", _p)]


class _Stack(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int) for name in (
        "num_layers", "hidden", "num_heads", "num_kv_heads", "head_dim", "rotary_dim", "intermediate",
        "block_size")] + [
        ("eps", ctypes.c_float), ("scale", ctypes.c_float), ("final_norm", _p), ("layers", ctypes.POINTER(_Layer))]


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _projection(linear: PackedLinear | PackedLinearBF16 | GGUFLinear) -> _Projection:
    """A packed or GGUF layer as the C table describes it."""
    if isinstance(linear, GGUFLinear):
        kind = linear.format + ("_I8" if linear.activations == "int8" else "")
        return _Projection(_FORMATS[kind], linear.out_features, _ptr(linear.qs), _ptr(linear.scales),
                           _ptr(linear.mins), _ptr(linear.bias))
    # Packed panels (float32 [panels, K, width], bfloat16 [panels, K / 2, width, 2]).
    panels, width = linear.packed.shape[0], linear.packed.shape[2]
    kind = "BF16" if isinstance(linear, PackedLinearBF16) else "F32"
    return _Projection(_FORMATS[kind], panels * width, _ptr(linear.packed), None, None, _ptr(linear.bias))


class CpuDecodeStack:
    """Runs :class:`~forkless.models.llama.LlamaModel`'s decode steps in one C call where
    that gives the modules' results (the module docstring says where).

    Built by the model's ``use_cpu_kernels``; :meth:`forward` returns None for a step it
    does not take. Its ``model`` arguments are a ``LlamaModel`` (the stack of layers
    under a ``LlamaForCausalLM``; not imported here, since it imports this).
    """

    def __init__(self) -> None:
        self._lib = cpu_kernels.load()
        # None: not decided yet (ops not bound); False: the modules always run.
        self._eligible: bool | None = None if self._lib is not None else False
        self._stack: _Stack | None = None
        self._layers: Any = None  # the ctypes array _stack points into
        self._caches: tuple[int, ...] = ()
        self._max_rows: int | None = None  # with GGUF layers: KERNEL_MAX_ROWS

    @staticmethod
    def applies_to(model: nn.Module) -> bool:
        """Whether ``model`` could ever take the stack (float32 or bfloat16, one rank, layers
        built)."""
        from forkless.distributed.parallel_state import get_pp_group, get_tp_group

        return (envs.FORKLESS_CPU_DECODE_STACK and model.dtype in _PROJECTIONS and get_tp_group().world_size == 1
                and get_pp_group().world_size == 1 and len(model.layers) > 0 and cpu_kernels.load() is not None)

    def forward(self, model: nn.Module, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[torch.Tensor], attn_metadata: "AttentionMetadata") -> torch.Tensor | None:
        """The final norm's output for this step, or None where the modules must run it."""
        if self._eligible is False or not kv_caches or input_ids.shape[0] == 0:
            return None
        if self._eligible is None:
            self._eligible = self._decide(model)
            if not self._eligible:
                return None
        if self._max_rows is not None and input_ids.shape[0] > self._max_rows:
            return None
        kp = self._decode_plan(attn_metadata, input_ids.shape[0])
        if kp is None:
            return None
        if self._caches != (id(kv_caches), kv_caches[0].data_ptr()):
            if not all(c.dtype == model.dtype and c.is_contiguous() for c in kv_caches):
                self._eligible = False  # an fp8 cache: the C table holds rows of the model's dtype
                return None
            self._bind(model, kv_caches)
        rotary = model.layers[0].self_attn.rotary_emb
        cos, sin = rotary.cos_sin(positions, model.dtype)
        hidden = model.embed_tokens(input_ids).contiguous()
        slots = kp.plan.store_slots
        cpu_kernels.check(getattr(self._lib, f"forkless_decode_stack_{_SUFFIX[model.dtype]}")(
            ctypes.byref(self._stack), hidden.data_ptr(), hidden.shape[0], cos.data_ptr(), sin.data_ptr(),
            cos.stride(0), slots.data_ptr(), kp.block_tables.data_ptr(), kp.block_tables.stride(0),
            kp.seq_lens.data_ptr(), kp.seq_ids.data_ptr(), kp.q_rows.data_ptr()))
        return hidden

    def _decide(self, model: nn.Module) -> bool | None:
        """True: every layer qualifies; False: one never will; None: an op is not bound yet."""
        from forkless.attention.backends.cpu_paged import CpuAttentionBackend
        from forkless.models.layers.activation import SiluAndMul
        from forkless.models.layers.norm import RMSNorm
        from forkless.models.layers.rotary import RotaryEmbedding

        ops: list[Any] = [model.norm]
        projection_types = _PROJECTIONS[model.dtype]
        for layer in model.layers:
            attn = layer.self_attn
            ops += [layer.input_layernorm, layer.post_attention_layernorm, attn.rotary_emb, layer.mlp.act_fn]
            if attn.qk_norm:
                ops += [attn.q_norm, attn.k_norm]
            projections = (attn.qkv_proj, attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj)
            if not all(type(lin) in projection_types for lin in projections):
                return False
            if any(type(lin) is GGUFLinear for lin in projections):
                self._max_rows = KERNEL_MAX_ROWS
            if type(attn.attn) is not CpuAttentionBackend or "forward" in vars(attn.attn):
                return False
            if attn.rotary_emb.rotary_dim % 2 or attn.num_heads % attn.num_kv_heads:
                return False
        if any(op.implementation == "_load_cpu_kernels_then_bind" for op in ops):
            return None
        # One eps serves every norm in the C table.
        return all(type(op) in (RMSNorm, RotaryEmbedding, SiluAndMul) and op.implementation == "forward_cpu"
                   and getattr(op, "eps", model.norm.eps) == model.norm.eps for op in ops)

    @staticmethod
    def _decode_plan(md: "AttentionMetadata", num_rows: int) -> Any:
        """The CPU backend's plan for this step (shared with its layers, built once a
        step), or None unless every row is a decode stored at its slot."""
        from forkless.attention.backends.cpu_paged import CpuAttentionBackend

        kp = md.backend_state.get("cpu")
        if kp is None:
            kp = md.backend_state["cpu"] = CpuAttentionBackend._kernel_plan(md, num_rows)
        plan = kp.plan
        if (not kp.all_rows or plan.prefills or plan.context_ids or len(plan.decode_ids) != num_rows
                or plan.store_rows != slice(0, num_rows)):
            return None
        return kp

    def _bind(self, model: nn.Module, kv_caches: list[torch.Tensor]) -> None:
        """Fill the C table with the layers' weights and these caches."""
        attn = model.layers[0].self_attn
        layers = (_Layer * len(model.layers))()
        for i, (layer, cache) in enumerate(zip(model.layers, kv_caches)):
            a, f = layer.self_attn, layer.mlp
            layers[i] = _Layer(
                _ptr(layer.input_layernorm.weight), _ptr(layer.post_attention_layernorm.weight),
                _ptr(a.q_norm.weight) if a.qk_norm else None, _ptr(a.k_norm.weight) if a.qk_norm else None,
                _projection(a.qkv_proj), _projection(a.o_proj), _projection(f.gate_up_proj),
                _projection(f.down_proj), _ptr(cache[0]), _ptr(cache[1]))
        self._layers = layers
        self._stack = _Stack(
            len(model.layers), model.hidden_size, attn.num_heads, attn.num_kv_heads, attn.head_dim,
            attn.rotary_emb.rotary_dim, model.layers[0].mlp.down_proj.in_features, kv_caches[0].shape[2],
            model.norm.eps, attn.attn.scale, _ptr(model.norm.weight),
            ctypes.cast(layers, ctypes.POINTER(_Layer)))
        self._caches = (id(kv_caches), kv_caches[0].data_ptr())

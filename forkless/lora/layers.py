"""Batched multi-LoRA execution in torch: slot-stacked weights and the wrapped layers.

Invariants:
    * Adapter weights live in ``max_loras`` preallocated slots per wrapped layer, padded
      to ``max_lora_rank`` with zeros, so any adapter fits any slot and a smaller rank
      adds exact zeros. ``lora_B`` is stored pre-multiplied by the adapter's scaling, the
      stacked projections' side by side in one ``[slot, rank, sum(widths)]`` tensor.
    * One step sets one :class:`LoRAStepContext`: the step's adapter tokens grouped by
      slot into a ``[slots, longest group]`` table of token indexes (punica's SGMV layout,
      padded). Every wrapped layer reads it, so a layer's LoRA work is one gather, one
      batched shrink over all used slots and one batched expand + scatter-add per stacked
      projection, whatever the mix of adapters: no Python loop over requests or adapters,
      and each token multiplies only its own adapter's weights (base-model tokens none).
    * A step without adapters (``LoRAStepContext.active`` false) runs the base layer alone
      (except while a CUDA graph is captured: the graph must hold the LoRA kernels).
    * On CUDA (with Triton) the layers run the shrink / expand kernels of
      :mod:`forkless.lora.triton_ops` instead: the context keeps the step's grouping in
      two persistent int32 device buffers (token indexes sorted by slot, and each slot's
      segment start), rewritten before every step, and the kernels' grid covers all
      ``max_loras`` slots whatever the step uses. So a decode graph captured once (with
      every segment empty) replays right for any mix of adapters, and swapping adapters
      only rewrites slot weights in place: nothing is ever recaptured.
    * Folding, on that path: where the wrapped layer is a plain ``nn.Linear``, the slots'
      A matrices are extra rows of one ``[W_base; A_slots]`` weight (the base layer's
      weight and the shrink weights are views of it), so a step of at most
      :data:`FOLD_MAX_TOKENS` tokens (decode, verification) computes the base output and
      every slot's shrink in one GEMM, and one expand launch adds each token's own delta
      while writing the layer's contiguous output (a third persistent buffer, each
      token's slot or -1, covers a graph's padding rows too). Larger steps (prefill) run
      the base GEMM and the segment kernels. A step without adapters, outside a graph,
      runs the base layer alone. (A folded GEMM's base columns may differ from the base
      layer's in the last bits, as any change of GEMM shape may.)
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from forkless.logger import init_logger
from forkless.lora.peft import AdapterSpec, read_adapter
from forkless.models.weight_loading import TensorShard
from forkless.triton_utils import triton_available

# The layer part of a checkpoint module name (``model.layers.3.``).
_LAYER = re.compile(r"^model\.layers\.\d+\.")

if TYPE_CHECKING:
    from forkless.protocol.lora import LoRARequest

logger = init_logger(__name__)

# Steps of at most this many tokens run folded (see the module notes). A folded step does
# every slot's shrink and expand work for every token (the other slots' as zeros), which
# costs launches nothing but grows with tokens x slots: prefill-sized steps group tokens by
# slot instead.
FOLD_MAX_TOKENS = 256


class LoRAStepContext:
    """The current step's tokens grouped by adapter slot, shared by every wrapped layer.

    Args:
        max_loras: Slots.
        device: Where the layers run.
        backend: ``"torch"`` (batched matmuls; every device) or ``"triton"`` (the
            kernels of :mod:`forkless.lora.triton_ops`; CUDA, or the CPU under
            ``TRITON_INTERPRET=1`` for tests).
        max_tokens: Tokens the persistent buffers of the Triton path hold (a step with
            more adapter tokens uses a buffer of its own, never seen by a graph).

    Attributes:
        active: Whether any token of the step uses an adapter (else layers run the base
            layer alone).
        capturing: A CUDA graph is being captured: the Triton path launches its kernels
            even with no adapter token, so that replays run them.
        num_slots: Slots ``[0, num_slots)`` are the ones the step uses (the highest used
            slot + 1). Torch path.
        group_len: Tokens in the largest slot group (each group is padded to it). Torch path.
        src: ``[num_slots * group_len]`` token index of each group entry (0 for padding).
            Torch path.
        back: ``[T]`` for each token of the step, its position in ``src``, or
            ``num_slots * group_len`` (a zero row appended to the deltas) for a
            base-model token: the deltas come back in token order with one gather. Torch path.
        sorted: int32 adapter tokens grouped by slot (a persistent buffer). Triton path.
        seg: ``[max_loras + 1]`` int32 segment starts into ``sorted`` (persistent). Triton path.
        token_slot: ``[max_tokens]`` int32 slot of each token of the step, -1 for the base
            model and past the step's tokens (persistent). Triton path, folded layers.
        fold_max_tokens: Largest step the folded layers run folded. Triton path.
    """

    def __init__(self, max_loras: int = 1, device: torch.device | None = None, backend: str = "torch",
                 max_tokens: int = 8192) -> None:
        if backend not in ("torch", "triton"):
            raise ValueError(f"unknown LoRA backend {backend!r} (torch, triton)")
        self.max_loras = max_loras
        self.backend = backend
        self.active = False
        self.capturing = False
        self.num_slots = 0
        self.group_len = 0
        self.src: torch.Tensor | None = None
        self.back: torch.Tensor | None = None
        self.ops: Any = None
        self.fold_max_tokens = 0
        if backend == "triton":
            from forkless.lora import triton_ops

            device = device or torch.device("cuda")
            self.ops = triton_ops
            self._device = device
            self._cuda = device.type == "cuda"
            self.fold_max_tokens = min(FOLD_MAX_TOKENS, max_tokens)
            self._max_tokens = max_tokens
            # One device buffer and one pinned staging area of the same layout (segment
            # starts, token slots, sorted tokens): two non-blocking copies a step; the
            # event guards the staging area against the next step's host writes.
            seg_len = max_loras + 1
            dev = torch.zeros(seg_len + 2 * max_tokens, dtype=torch.int32, device=device)
            dev[seg_len:seg_len + max_tokens] = -1
            self.seg = dev[:seg_len]
            self.token_slot = dev[seg_len:seg_len + max_tokens]
            self._sorted_buf = dev[seg_len + max_tokens:]
            self._dev = dev
            self.sorted = self._sorted_buf
            staging = dev.cpu()
            self._staging = staging.pin_memory() if self._cuda else staging
            self._copied: Any = None
            # token_slot rows that may be >= 0; 0: the buffers say "no adapter token".
            self._slot_rows = 0

    def set(self, token_slot: np.ndarray, device: torch.device) -> None:
        """Group tokens by slot (``token_slot[t]``: its slot, or -1 for the base model)."""
        if self.ops is not None:
            self._set_buffers(token_slot)
            return
        used = np.flatnonzero(token_slot >= 0)
        if used.size == 0:
            self.clear()
            return
        slots = token_slot[used]
        order = np.argsort(slots, kind="stable")
        tokens, slots = used[order], slots[order]
        num_slots = int(slots[-1]) + 1
        counts = np.bincount(slots, minlength=num_slots)
        group_len = int(counts.max())
        # Entry k of slot s is at s * group_len + k.
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        positions = slots * group_len + (np.arange(tokens.size) - starts[slots])
        src = np.zeros(num_slots * group_len, dtype=np.int64)
        src[positions] = tokens
        back = np.full(token_slot.shape[0], num_slots * group_len, dtype=np.int64)
        back[tokens] = positions
        self.active = True
        self.num_slots, self.group_len = num_slots, group_len
        self.src = torch.from_numpy(src).to(device)
        self.back = torch.from_numpy(back).to(device)

    def _set_buffers(self, token_slot: np.ndarray) -> None:
        """Triton path: write the step's segments into the persistent device buffers.

        A captured graph reads these very buffers, so they are written for every step,
        eager or replayed (skipped only when they already say "no adapter token"). The
        token slots are rewritten up to the longest step since they were last all -1, so
        rows past this step's tokens (a graph's padding) read -1.
        """
        used = np.flatnonzero(token_slot >= 0)
        self.active = used.size > 0
        if not self.active and self._slot_rows == 0:
            self.sorted = self._sorted_buf
            return
        slots = token_slot[used]
        order = np.argsort(slots, kind="stable")
        seg_len, cap = self.max_loras + 1, self._max_tokens
        if self._copied is not None:
            self._copied.synchronize()  # the last step's copies read the staging area
        staging = self._staging.numpy()
        staging[0] = 0
        np.cumsum(np.bincount(slots, minlength=self.max_loras), out=staging[1:seg_len])
        t = min(token_slot.shape[0], cap)
        rows = max(t, self._slot_rows)
        staging[seg_len + t:seg_len + rows] = -1
        staging[seg_len:seg_len + t] = token_slot[:t]
        self._dev[:seg_len + rows].copy_(self._staging[:seg_len + rows], non_blocking=self._cuda)
        n = used.size
        sorted_at = seg_len + cap
        if n <= cap:
            staging[sorted_at:sorted_at + n] = used[order]
            self.sorted = self._sorted_buf
            if n:
                self.sorted[:n].copy_(self._staging[sorted_at:sorted_at + n], non_blocking=self._cuda)
        else:  # more adapter tokens than the buffer: an eager step, never a graph's
            self.sorted = torch.from_numpy(used[order].astype(np.int32)).to(self._device)
        self._slot_rows = t if n else 0
        if self._cuda:
            self._copied = torch.cuda.Event()
            self._copied.record()

    def clear(self) -> None:
        """No adapters in this step."""
        if self.ops is not None:
            self._set_buffers(np.full(0, -1, dtype=np.int64))
            return
        self.active = False
        self.num_slots = self.group_len = 0
        self.src = self.back = None


class LoRALinear(nn.Module):
    """A linear layer (plain, packed or fused) plus the LoRA deltas of up to ``max_loras`` adapters.

    ``y[t] += (x[t] A_{s,i}^T) B_{s,i}^T`` for each token ``t`` of an adapter (in slot ``s``)
    and each stacked projection ``i`` (its columns of ``y``).

    Args:
        base: The layer to wrap; maps ``[T, in_features]`` to ``[T, sum(widths)]``.
        in_features: Its input width.
        widths: Output width of each stacked projection, in column order.
        max_loras: Slots.
        max_rank: Rank every slot is padded to.
        ctx: The shared step context.
        dtype: Weight dtype (the model's).
        device: Where the slots live.

    Attributes:
        w_ext: ``[sum(widths) + max_loras * len(widths) * max_rank, in_features]``, the
            base weight's rows then every slot's A rows, where the layer is folded (the
            Triton path over a plain ``nn.Linear`` of the model's dtype; see the module
            notes); else None.
        bias_ext: The base bias, then zeros for the A rows (folded layers with a bias).
    """

    def __init__(self, base: nn.Module, in_features: int, widths: list[int], max_loras: int, max_rank: int,
                 ctx: LoRAStepContext, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.base = base
        self.in_features = in_features
        self.widths = list(widths)
        self.offsets = [int(o) for o in np.cumsum([0, *widths[:-1]])]
        self.max_rank = max_rank
        self.ctx = ctx
        n = len(widths)
        out = sum(widths)
        # Folded (see the module notes): [W_base; slot 0's A rows; slot 1's; ...], the base
        # layer's weight (and bias) becoming views of the first rows.
        self.w_ext: torch.Tensor | None = None
        self.bias_ext: torch.Tensor | None = None
        if (ctx.ops is not None and type(base) is nn.Linear and base.weight.dtype == dtype
                and tuple(base.weight.shape) == (out, in_features)):
            w_ext = torch.zeros(out + max_loras * n * max_rank, in_features, dtype=dtype, device=device)
            w_ext[:out].copy_(base.weight.detach())
            base.weight = nn.Parameter(w_ext[:out], requires_grad=False)
            if base.bias is not None:
                bias_ext = torch.zeros(w_ext.shape[0], dtype=dtype, device=device)
                bias_ext[:out].copy_(base.bias.detach())
                base.bias = nn.Parameter(bias_ext[:out], requires_grad=False)
                self.bias_ext = bias_ext
            self.w_ext = w_ext
            # The same [slot, in, projection * rank] view the segment kernels read.
            lora_a = w_ext[out:].view(max_loras, n * max_rank, in_features).transpose(1, 2)
        else:
            # [slot, in, projection * rank] (A transposed): the used slots are one contiguous
            # leading block, so a step's shrink is one batched matmul over a view.
            lora_a = torch.zeros(max_loras, in_features, n * max_rank, dtype=dtype, device=device)
        self.register_buffer("lora_a", lora_a, persistent=False)
        # [slot, rank, sum(widths)]: the projections' B (scaled, transposed) side by side in
        # the output's column order, so the Triton path expands them all in one launch.
        self.register_buffer("lora_b_all", torch.zeros(max_loras, max_rank, out, dtype=dtype,
                                                       device=device), persistent=False)

    def lora_b(self, i: int) -> torch.Tensor:
        """``[slots, rank, width]`` expand weights of stacked projection ``i`` (scaled, transposed; a view)."""
        off = self.offsets[i]
        return self.lora_b_all[:, :, off:off + self.widths[i]]

    def set_slot(self, slot: int, weights: list[tuple[torch.Tensor, torch.Tensor] | None]) -> None:
        """Write one adapter into ``slot``.

        Args:
            slot: The slot.
            weights: Per stacked projection, ``(A [r, in], B_scaled [out, r])``, or
                ``None`` where the adapter does not target it (zeros).
        """
        self.lora_a[slot].zero_()
        for i, pair in enumerate(weights):
            b = self.lora_b(i)
            b[slot].zero_()
            if pair is None:
                continue
            a, bs = pair
            r = a.shape[0]
            lo = i * self.max_rank
            self.lora_a[slot, :, lo:lo + r].copy_(a.t())
            b[slot, :r].copy_(bs.t())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ctx = self.ctx
        if ctx.ops is not None and (ctx.active or ctx.capturing):
            x2 = x.reshape(-1, self.in_features)
            if self.w_ext is not None and x2.shape[0] <= ctx.fold_max_tokens:
                z = torch.nn.functional.linear(x2, self.w_ext, self.bias_ext)
                y = ctx.ops.lora_expand_folded(z, self.lora_b_all, self.widths, ctx.token_slot, self.max_rank)
                return y.view(*x.shape[:-1], y.shape[-1])
            y = self.base(x)
            self._forward_triton(x, y)
            return y
        y = self.base(x)
        if not ctx.active or ctx.ops is not None:
            return y
        slots, group = ctx.num_slots, ctx.group_len
        n = len(self.widths)
        rank = self.max_rank
        x2 = x.reshape(-1, self.in_features)
        y2 = y.reshape(x2.shape[0], y.shape[-1])  # the same tensor for the [T, out] of the models here
        # Shrink: [slots, group, in] x [slots, in, n * rank], every stacked projection at once.
        xs = x2.index_select(0, ctx.src).view(slots, group, self.in_features)
        h = torch.bmm(xs, self.lora_a[:slots])  # [slots, group, n * rank]
        if n > 1:  # [n, slots, group, rank]: each projection's block contiguous
            h = h.view(slots, group, n, rank).permute(2, 0, 1, 3).contiguous()
        else:
            h = h.unsqueeze(0)
        for i, (off, width) in enumerate(zip(self.offsets, self.widths)):
            # Expand: [slots, group, rank] x [slots, rank, width]; a zero row appended for
            # the base model's tokens, then one gather puts the rows in token order (each
            # token is in one group at most: no scatter-add needed).
            delta = torch.bmm(h[i], self.lora_b(i)[:slots]).view(slots * group, width)
            delta = torch.cat([delta, delta.new_zeros(1, width)]).index_select(0, ctx.back)
            if n == 1:
                y2 += delta
            else:
                y2[:, off:off + width] += delta
        return y2.reshape(y.shape)

    def _forward_triton(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """Add the deltas into ``y`` in place with the Triton kernels (one shrink and one
        expand for all stacked projections; grids over every slot, so graph-capturable)."""
        ctx = self.ctx
        ops = ctx.ops
        x2 = x.reshape(-1, self.in_features)
        y2 = y.view(x2.shape[0], y.shape[-1])  # a view: the kernels write y itself
        h = ops.lora_shrink(x2, self.lora_a, ctx.sorted, ctx.seg, ctx.max_loras)
        ops.lora_expand(h, self.lora_b_all, y2, self.widths, ctx.sorted, ctx.seg, ctx.max_loras)


@dataclass
class _Loaded:
    """An adapter's tensors on the host, per checkpoint module: ``(A, B * scaling)``."""

    spec: AdapterSpec
    tensors: dict[str, tuple[torch.Tensor, torch.Tensor]]


class LoRAModelManager:
    """Wraps a model's LoRA layers and keeps adapters in slots and in a host LRU cache.

    Args:
        model: A model whose class sets ``supports_lora`` (weights loaded; after
            ``use_cpu_kernels``).
        max_loras: Slots: adapters one step may use.
        max_lora_rank: Largest rank accepted.
        max_cpu_loras: Adapters kept loaded on the host (least recently used evicted).
        dtype: The model dtype.
        device: The model's device.
        backend: ``"torch"`` or ``"triton"`` (see :class:`LoRAStepContext`); ``None``:
            Triton on CUDA where it is installed, else torch.
        max_tokens: Largest step, in tokens (``max(max_num_batched_tokens,
            max_num_seqs)``): sizes the Triton path's persistent buffers.

    Raises:
        ValueError: The model does not support LoRA.
    """

    def __init__(self, model: nn.Module, *, max_loras: int, max_lora_rank: int, max_cpu_loras: int,
                 dtype: torch.dtype, device: torch.device, backend: str | None = None,
                 max_tokens: int = 8192) -> None:
        if not getattr(type(model), "supports_lora", False):
            raise ValueError(f"--enable-lora: the model class {type(model).__qualname__} does not support LoRA "
                             "(supports_lora is False)")
        self.model = model
        self.max_loras = max_loras
        self.max_lora_rank = max_lora_rank
        self.max_cpu_loras = max_cpu_loras
        self.dtype = dtype
        self.device = device
        if backend is None:
            backend = "triton" if device.type == "cuda" and triton_available() else "torch"
        self.ctx = LoRAStepContext(max_loras, device, backend, max_tokens)
        # Checkpoint module name -> (wrapped layer, its stacked projection index).
        self._targets: dict[str, tuple[LoRALinear, int]] = {}
        # Checkpoint module name -> its whole (in, out) shape, what adapters are checked against.
        self._shapes: dict[str, tuple[int, int]] = {}
        # With -tp: checkpoint module name -> this rank's part of its weight, as the model
        # reads it (rows of a column-parallel projection: slice B's rows; columns of a
        # row-parallel one: slice A's columns; the all-reduce after it sums the ranks' deltas).
        self._shards: dict[str, TensorShard] = {}
        self._layers: list[LoRALinear] = []
        tp = model.tensor_parallel_size
        for path, parts in model.lora_modules().items():
            parent_path, _, attr = path.rpartition(".")
            parent = model.get_submodule(parent_path)
            base = getattr(parent, attr)
            in_features = int(getattr(base, "in_features"))
            widths = []
            for name, width in parts:
                shard = model.weight_shard(f"{name}.weight", (width, in_features)) if tp > 1 else None
                if shard is not None:
                    self._shards[name] = shard
                full_in = in_features * tp if shard is not None and shard.dim == 1 else in_features
                self._shapes[name] = (full_in, width)
                widths.append(shard.size if shard is not None and shard.dim == 0 else width)
            layer = LoRALinear(base, in_features, widths, max_loras, max_lora_rank, self.ctx, dtype, device)
            setattr(parent, attr, layer)
            self._layers.append(layer)
            for i, (name, _) in enumerate(parts):
                self._targets[name] = (layer, i)
        if model.pipeline_parallel_size > 1:
            # This stage adapts its own layers; an adapter's other layers are checked against
            # the same shapes (every decoder layer has them) and left to their stages.
            for name, shape in list(self._shapes.items()):
                for j in range(model.config.num_hidden_layers):
                    self._shapes.setdefault(_LAYER.sub(f"model.layers.{j}.", name, count=1), shape)
        # Host cache: lora_int_id -> tensors, most recently used last.
        self._cpu: OrderedDict[int, _Loaded] = OrderedDict()
        # Slots: lora_int_id -> slot, most recently used last.
        self._slot_of: OrderedDict[int, int] = OrderedDict()
        self.loads = 0
        self.evictions = 0

    @property
    def module_shapes(self) -> dict[str, tuple[int, int]]:
        """Checkpoint module name -> ``(in_features, out_features)`` of every adaptable projection."""
        return dict(self._shapes)

    def loaded_ids(self) -> list[int]:
        """Adapters in the host cache, least recently used first."""
        return list(self._cpu)

    def add_adapter(self, lora: LoRARequest) -> None:
        """Load an adapter into the host cache (evicting the least recently used one).

        Raises:
            forkless.lora.peft.LoRAAdapterError: The adapter is malformed or does not fit
                the model.
        """
        if lora.lora_int_id in self._cpu:
            if not lora.load_inplace:
                self._cpu.move_to_end(lora.lora_int_id)
                return
            # Read again and replace: the slot is rewritten on the adapter's next activation.
            self._cpu.pop(lora.lora_int_id)
            self._slot_of.pop(lora.lora_int_id, None)
        from safetensors import safe_open

        spec = read_adapter(lora, max_rank=self.max_lora_rank, module_shapes=self._shapes)
        tensors: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        with safe_open(str(spec.weights_file), framework="pt", device="cpu") as f:
            for module, (a_key, b_key) in spec.modules.items():
                if module not in self._targets:
                    continue  # another pipeline stage's layer
                a = f.get_tensor(a_key).to(torch.float32)
                b = f.get_tensor(b_key).to(torch.float32) * spec.scaling
                shard = self._shards.get(module)
                if shard is not None:  # this rank's part (see __init__)
                    if shard.dim == 0:
                        b = b.narrow(0, shard.start, shard.size)
                    else:
                        a = a.narrow(1, shard.start, shard.size)
                tensors[module] = (a.to(self.dtype).contiguous(), b.to(self.dtype).contiguous())
        while len(self._cpu) >= self.max_cpu_loras:
            old, _ = self._cpu.popitem(last=False)
            self.evictions += 1
            logger.info("LoRA: evicted adapter id %d from the host cache (--max-cpu-loras %d)",
                        old, self.max_cpu_loras)
        self._cpu[lora.lora_int_id] = _Loaded(spec, tensors)
        self.loads += 1
        logger.info("LoRA: loaded adapter %r (id %d, r=%d, %d modules) from %s", lora.lora_name,
                    lora.lora_int_id, spec.rank, len(tensors), spec.path)

    def remove_adapter(self, lora_int_id: int) -> bool:
        """Drop an adapter from the host cache and its slot; whether it was there."""
        found = self._cpu.pop(lora_int_id, None) is not None
        return self._slot_of.pop(lora_int_id, None) is not None or found

    def _activate(self, lora: LoRARequest, in_use: set[int]) -> int:
        """The slot of ``lora``, writing it into one (the least recently used one not in ``in_use``)."""
        lid = lora.lora_int_id
        slot = self._slot_of.get(lid)
        if slot is not None:
            self._slot_of.move_to_end(lid)
            return slot
        self.add_adapter(lora)
        taken = set(self._slot_of.values())
        free = [s for s in range(self.max_loras) if s not in taken]
        if free:
            slot = free[0]
        else:
            victim = next((v for v in self._slot_of if v not in in_use), None)
            if victim is None:
                raise RuntimeError(f"a step uses more than --max-loras {self.max_loras} adapters")
            slot = self._slot_of.pop(victim)
        loaded = self._cpu[lid]
        self._cpu.move_to_end(lid)
        per_layer: dict[int, list[Any]] = {}
        for name, (layer, i) in self._targets.items():
            entry = per_layer.setdefault(id(layer), [layer, [None] * len(layer.widths)])
            entry[1][i] = loaded.tensors.get(name)
        for layer, weights in per_layer.values():
            layer.set_slot(slot, [None if w is None else (w[0].to(self.device), w[1].to(self.device))
                                  for w in weights])
        self._slot_of[lid] = slot
        return slot

    def set_step(self, loras: list[LoRARequest | None], num_tokens: np.ndarray) -> None:
        """Assign this step's adapters to slots and group the tokens by slot.

        Args:
            loras: Per row of the step, its adapter or ``None`` (the base model).
            num_tokens: Per row, its tokens this step.

        Raises:
            RuntimeError: The rows use more than ``max_loras`` adapters.
        """
        ids = {lora.lora_int_id for lora in loras if lora is not None}
        if not ids:
            self.ctx.clear()
            return
        if len(ids) > self.max_loras:
            raise RuntimeError(f"a step uses {len(ids)} adapters, more than --max-loras {self.max_loras}")
        row_slot = np.fromiter((-1 if lora is None else self._activate(lora, ids) for lora in loras),
                               dtype=np.int64, count=len(loras))
        self.ctx.set(np.repeat(row_slot, num_tokens), self.device)

    def clear_step(self) -> None:
        """No adapters until the next :meth:`set_step` (profiling runs, graphs)."""
        self.ctx.clear()

    @property
    def supports_cuda_graphs(self) -> bool:
        """Whether decode graphs may be captured with these layers (the Triton path)."""
        return self.ctx.ops is not None and self.device.type == "cuda"

    @contextmanager
    def capturing(self) -> Iterator[None]:
        """While CUDA graphs are captured: every segment empty, kernels launched anyway."""
        self.ctx.clear()
        self.ctx.capturing = True
        try:
            yield
        finally:
            self.ctx.capturing = False

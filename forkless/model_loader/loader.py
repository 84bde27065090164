"""Build a registered model class on a device and fill it with a folder's weights.

Invariant: the model is built with its layers' random initialisation skipped
(:func:`skip_random_init`): every parameter is then written from the checkpoint (or by
the dummy format's seeded init), so drawing random numbers first is wasted work; on the
default model it was 1.5-2.2 s of a 5 s start on 2 cores (benchmarks/README.md).
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import TYPE_CHECKING, Any, Iterator

import torch

from forkless.logger import init_logger
from forkless.model_loader.dtype import resolve_dtype
from forkless.model_loader.weights import iterate_weights
from forkless.models.registry import ModelRegistry

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from forkless.attention import AttentionBackend
    from forkless.models.interface import CausalLMBase

logger = init_logger(__name__)

LOAD_FORMATS = ("auto", "dummy")
_DUMMY_SEED = 0


# The random initialisers of torch.nn.init that layer constructors call
# (``nn.Linear.reset_parameters``: kaiming_uniform_ and uniform_; ``nn.Embedding``:
# normal_). Constant ones (ones_, zeros_, constant_) are cheap and stay.
_RANDOM_INITS = ("uniform_", "normal_", "trunc_normal_", "kaiming_uniform_", "kaiming_normal_",
                 "xavier_uniform_", "xavier_normal_", "orthogonal_", "sparse_")


def _keep(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    return tensor


@contextlib.contextmanager
def skip_random_init() -> Iterator[None]:
    """Make ``torch.nn.init``'s random initialisers no-ops while the model is built.

    Parameters keep whatever ``torch.empty`` gave them until the weights are loaded;
    loading checks that every parameter got a tensor (``load_named_weights`` raises
    otherwise). The functions are restored on exit, also after an error. Like
    transformers' ``no_init_weights``, this patches the module for the whole process:
    the worker builds one model at a time.
    """
    saved = {name: getattr(torch.nn.init, name) for name in _RANDOM_INITS if hasattr(torch.nn.init, name)}
    try:
        for name in saved:
            setattr(torch.nn.init, name, _keep)
        yield
    finally:
        for name, fn in saved.items():
            setattr(torch.nn.init, name, fn)


def _init_dummy(model: torch.nn.Module) -> None:
    """Small seeded random weights: reproducible, and finite through any depth."""
    with torch.no_grad():
        for param in model.parameters():
            generator = torch.Generator(device=param.device).manual_seed(_DUMMY_SEED)
            param.uniform_(-0.02, 0.02, generator=generator)


def load_model(
    model_dir: str | os.PathLike[str],
    hf_config: "PretrainedConfig | None",
    dtype: str | torch.dtype,
    device: str | torch.device,
    attn_backend: "type[AttentionBackend] | str",
    load_format: str = "auto",
) -> "CausalLMBase":
    """Build the model for ``hf_config.architectures`` and load its weights.

    Args:
        model_dir: Hugging Face model folder (``config.json`` + ``*.safetensors``).
        hf_config: The folder's config; ``None`` reads it (``load_hf_config``).
        dtype: A ``torch.dtype`` or a ``--dtype`` name (see
            :func:`forkless.model_loader.resolve_dtype`).
        device: Where parameters are created (``"cpu"``, ``"cuda:0"``...).
        attn_backend: Backend class, or its registered name (``"torch"``).
        load_format: ``"auto"`` reads the folder's weights; ``"dummy"`` fills the model
            with seeded random values (benchmarks, tests) and reads no weight file.

    Returns:
        The model in eval mode with gradients disabled, parameters on ``device``.

    Raises:
        ValueError: Unknown ``load_format`` or ``dtype``, or checkpoint/model mismatch.
        forkless.models.registry.UnsupportedArchitectureError: No registered class for
            the config's architectures.
    """
    if load_format not in LOAD_FORMATS:
        raise ValueError(f"unknown load_format {load_format!r}; choose one of: {', '.join(LOAD_FORMATS)}")
    if hf_config is None:
        from forkless.models.hf_config import load_hf_config

        hf_config = load_hf_config(model_dir)
    if isinstance(attn_backend, str):
        from forkless.attention import get_attention_backend

        attn_backend = get_attention_backend(attn_backend)
    device = torch.device(device)
    dtype = resolve_dtype(dtype, hf_config, device)
    model_cls, arch = ModelRegistry.resolve_model_cls(getattr(hf_config, "architectures", None) or [])
    _check_model_cls(model_cls, arch)
    from forkless.distributed.parallel_state import get_pp_group, get_tp_group
    from forkless.models.interface import CausalLMBase
    from forkless.pooling.interface import SupportsPooling

    tp = get_tp_group().world_size
    if tp > 1 and not (issubclass(model_cls, (CausalLMBase, SupportsPooling)) and model_cls.supports_tensor_parallel):
        raise ValueError(f"{arch} ({model_cls.__module__}.{model_cls.__qualname__}) does not support tensor "
                         f"parallelism (supports_tensor_parallel is False): run it with --tensor-parallel-size 1, "
                         f"not {tp}")
    pp = get_pp_group().world_size
    if pp > 1 and not (issubclass(model_cls, CausalLMBase) and model_cls.supports_pipeline_parallel):
        raise ValueError(f"{arch} ({model_cls.__module__}.{model_cls.__qualname__}) does not support pipeline "
                         f"parallelism (supports_pipeline_parallel is False): run it with "
                         f"--pipeline-parallel-size 1, not {pp}")

    start = time.perf_counter()
    with torch.device(device), skip_random_init():
        model = model_cls(hf_config, dtype, attn_backend)
    if load_format == "dummy":
        _init_dummy(model)
    elif tp > 1 or pp > 1:  # (then a model that declared it, checked above: it has weight_shard)
        # Each rank reads its part of every tensor it shares, and nothing of another stage's.
        model.load_weights(iterate_weights(model_dir, dtype, shard=model.weight_shard))
    else:
        model.load_weights(iterate_weights(model_dir, dtype))
    model.eval().requires_grad_(False)
    logger.info(
        "loaded the model weights in %.2f s: %s (%s, %s, %s weights) on %s",
        time.perf_counter() - start, arch, model_cls.__name__, dtype, load_format, device,
    )
    return model


def _check_model_cls(model_cls: Any, arch: str) -> None:
    """Refuse a registered class that forkless cannot build, naming the registration.

    Raises:
        TypeError: Not a ``torch.nn.Module`` class, or written for vLLM's constructor
            (``vllm_config``, ``prefix``) rather than forkless's.
    """
    import inspect

    where = f"{arch} is registered as {ModelRegistry.get_path(arch) or model_cls!r}"
    if not (inspect.isclass(model_cls) and issubclass(model_cls, torch.nn.Module)):
        raise TypeError(f"{where}, which is not a model class: expected a torch.nn.Module subclass, such as "
                        "forkless.models.interface.CausalLMBase's")
    params = inspect.signature(model_cls.__init__).parameters
    if "vllm_config" in params:
        raise TypeError(f"{where}, whose constructor takes vLLM's (vllm_config, prefix): forkless builds a model "
                        "as cls(hf_config, dtype, attn_backend) (docs/plugins.md, models)")

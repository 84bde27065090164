"""Engine configuration: ``EngineArgs`` (flags) -> ``EngineConfig`` (resolved plain data).

``EngineArgs`` mirrors vLLM's flag names. ``EngineArgs.create_engine_config()`` resolves
everything that needs the model folder (path, architecture, context length, EOS ids) once,
in the process that parses the flags. The resulting ``EngineConfig`` is a tree of plain
dataclasses that round-trips through ``msgspec.to_builtins`` / ``msgspec.convert``, so it
can cross a process boundary as msgpack; each process reloads the Hugging Face config from
``model_config.model`` itself.

Only the standard library, msgspec and forkless's light modules are imported here: the API
server builds the config without torch.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import msgspec

from forkless.core.block_pool import HASH_ALGOS
from forkless.core.sched.config import SCHEDULING_POLICIES, SchedulerConfig
from forkless.json_arg import json_object_arg
from forkless.kv_transfer.config import KVTransferConfig
from forkless.logger import init_logger
from forkless.pooling.config import CONVERTS, RUNNERS, PoolerConfig
from forkless.reasoning.config import ReasoningConfig
from forkless.sampling_params import SamplingParams
from forkless.spec_decode.config import SpeculativeConfig
from forkless.structured_output.config import StructuredOutputsConfig

logger = init_logger(__name__)

DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")
#: vLLM's other ``--dtype`` names.
DTYPE_ALIASES = {"half": "float16", "float": "float32"}
LOAD_FORMAT_CHOICES = ("auto", "dummy")
#: ``--kv-cache-dtype`` values (vLLM's names): ``auto`` stores the model dtype; ``fp8`` and
#: ``fp8_e4m3`` store float8 e4m3 (one byte per element) with per-layer scales of 1.0.
KV_CACHE_DTYPE_CHOICES = ("auto", "fp8", "fp8_e4m3")
#: ``--quantization`` values (vLLM's flag): ``gguf`` keeps a GGUF file's Q8_0 / Q4_1 matrices quantized.
QUANTIZATION_CHOICES = ("gguf",)
GiB = 1 << 30
# On CPU the KV cache lives in host memory next to everything else: take a modest share.
CPU_KV_CACHE_FRACTION = 0.25
CPU_KV_CACHE_MAX_BYTES = 4 * GiB
# A model advertising a 128k context would otherwise ask for a huge per-request KV
# reservation on CPU; users can still pass --max-model-len explicitly.
CPU_DEFAULT_MAX_MODEL_LEN_CAP = 8192
# A step's token budget on CPU. Larger steps allocate intermediates above glibc's largest
# mmap threshold (32 MiB), which come fresh from the kernel each time and fault their pages
# in again; at 2,048 tokens they are reused from the heap: ~10 % faster prefill with the
# default model than at 8,192 (benchmarks/README.md).
CPU_DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048
# A pooling step on CPU: an encoder's activations are small, and 8,192 tokens a step embed
# ~15-20 % faster than 2,048 (fewer, larger attention calls; benchmarks/README.md, "Embeddings").
CPU_POOLING_MAX_NUM_BATCHED_TOKENS = 8192
# On CPU, for the server (AsyncEngineArgs), a prompt with more than this many tokens left is
# long: it takes at most this many tokens of each step, and one long prompt prefills at a
# time (vLLM's default is neither). The offline engine keeps vLLM's rule (no cap): a batch
# job has no other client to be fair to, and serializing every prompt over 64 tokens would
# cost its throughput.
# Uncapped, an 8k-token prompt filled four 2,048-token steps of ~20 s each and a short
# request that arrived meanwhile waited for all of them; capped, it is admitted in the next
# step and decodes next to the long prefill, each step slower by one chunk. On a 2-core CPU
# with the default model, 16-token requests' p99 under a stream of 8k-token prompts is
# 232x its baseline uncapped, 35x at 256, 8-9x at 64, 6x at 32; an 8k prompt alone takes
# 3 % longer than uncapped at 256, 16 % at 64, 97 % at 16: 64 is the knee
# (benchmarks/README.md, "Hostile clients").
CPU_DEFAULT_LONG_PREFILL_TOKEN_THRESHOLD = 64
# On CPU, for the server, a prompt of at most this many tokens is never long, whatever the
# threshold above says (forkless.core.sched.scheduler): the cap of 64 is for 8k prompts, and
# with it alone every prompt over 64 tokens was long, chunked, and admitted one at a time:
# 16 streams of 40-120-token prompts got their first tokens ~2x later than with vLLM's rule
# (TTFT p99 1.9 s vs 1.0 s, 12 % fewer tokens/s). Ordinary prompts then go whole; an 8k one
# is still chunked at 64 (benchmarks/README.md, "Against vLLM-CPU").
CPU_DEFAULT_LONG_PREFILL_MIN_PROMPT_TOKENS = 256
# On CPU, for the server, long prefills take at most 40 % of the step time while other
# requests run (forkless.core.sched.time_share): a token cap alone still let an 8k prompt
# make 16-token requests 8x slower, because late in a long context even a few chunk
# tokens cost more than a whole decode step. The others then take at most 1 / 0.6 = 1.67x
# as long as alone, plus one chunk; half (a fair share between two clients, 2x) measured
# 1.8-2.1x, too close to the 2x the hostile-client benchmark holds them to.
CPU_DEFAULT_LONG_PREFILL_TIME_SHARE = 0.4
# On CPU, for the server, at most this many sequences of one request (its prompts x n) run
# at once (forkless.core.sched.scheduler). A decode step's time grows with its batch on a
# CPU: one request for 256 sequences at once made every other request's step ~20x
# slower, and made it wait for all 256 first (48x its p99 on a 2-core CPU with the
# default model; benchmarks/README.md, "Hostile clients").
CPU_DEFAULT_MAX_RUNNING_SEQS_PER_REQUEST = 8
# On CPU, for the server, while requests of more than one client are in the engine, one
# client's prompts compute this many tokens a step on average, twice this at most in one
# step (forkless.core.sched.scheduler). 32 streams of one client that each dropped after
# their first token made a step prefill ~30 prompts (~3 s on a 2-core CPU) and another
# client's 16-token request 11.6x slower at the p99; at 8 (a 16-token prompt every other
# step) ~1.5x, at 16 (one every step) ~2.1x (benchmarks/README.md, "Hostile clients").
CPU_DEFAULT_MAX_PREFILL_TOKENS_PER_CLIENT = 8


#: vLLM engine arguments for what forkless does one way only -> (the values that ask for
#: that way, what is expected otherwise). Accepted so that vLLM's scripts run unchanged;
#: any other value is refused, never ignored.
VLLM_ONLY_DEFAULTS: dict[str, tuple[tuple[Any, ...], str]] = {
    "tokenizer_mode": (("auto", "hf"), "auto (forkless loads the model folder's Hugging Face tokenizer)"),
    "revision": ((None,), "none: forkless loads local folders, with no hub revision"),
    "tokenizer_revision": ((None,), "none: forkless loads local folders, with no hub revision"),
    "hf_token": ((None, False), "none: forkless downloads nothing from the hub"),
    "hf_overrides": ((None, {}), "none: forkless reads config.json as it is"),
    "skip_tokenizer_init": ((False,), "False: forkless always loads the tokenizer"),
    "swap_space": ((None, 0, 4), "0 or vLLM's default 4: forkless never swaps KV blocks to host memory "
                                  "(a preempted request is recomputed, as in vLLM v1)"),
    "cpu_offload_gb": ((0,), "0: forkless keeps the weights on the device"),
    "data_parallel_size": ((1,), "1: run several forkless servers behind a load balancer instead"),
    "mm_processor_kwargs": ((None, {}), "none: forkless serves text models"),
    "allowed_local_media_path": (("",), "empty: forkless serves text models"),
    # forkless has no custom all-reduce to disable: either value runs torch.distributed's.
    "disable_custom_all_reduce": ((False, True), "a bool"),
}


#: vLLM engine arguments whose ``None`` means "the default" (vLLM types them optional, and
#: scripts pass their own argparse default ``None`` through): ``None`` becomes forkless's
#: default, which is vLLM's (``seed`` 0, as vLLM's v1 sets a ``None`` seed). Left as
#: ``None``, a block size crashed later and ``None`` prefix caching meant off.
NONE_MEANS_DEFAULT = ("seed", "block_size", "max_num_seqs", "enable_prefix_caching", "enable_chunked_prefill")


def _bad_flag(flag: str, value: Any, expected: str) -> ValueError:
    return ValueError(f"{flag}={value!r} is invalid: expected {expected}")


@functools.lru_cache(maxsize=8)
def _hf_config(model_dir: str) -> Any:
    from forkless.models.hf_config import load_hf_config

    return load_hf_config(model_dir)


@dataclass(kw_only=True)
class ModelConfig:
    """The model, as resolved from its folder.

    Attributes:
        model: Local Hugging Face model folder (GGUF files are converted first).
        tokenizer: Folder the tokenizer is loaded from.
        served_model_name: The name clients use (``--served-model-name``'s first).
        served_model_names: Every name clients may use (``--served-model-name A B``); the
            first is ``served_model_name``, the one responses report.
        architecture: The ``config.json`` architecture the model class is chosen by.
        dtype: Resolved dtype name (``"float32"``, ``"bfloat16"`` or ``"float16"``).
        max_model_len: Longest sequence (prompt + output) a request may reach.
        vocab_size: Size of the logits' last dimension.
        eos_token_id: The model's primary EOS token, or ``None``.
        generation_config: Plain-data subset of ``generation_config.json`` (EOS ids...).
        sampling_defaults: The sampling parameters requests default to where they set
            none (``--generation-config`` / ``--override-generation-config``, vLLM's
            rule): ``temperature``, ``top_p``, ``top_k``, ``min_p``,
            ``repetition_penalty`` and ``max_tokens`` (``max_new_tokens``), those given.
        load_format: ``"auto"`` (read weights) or ``"dummy"`` (random weights).
        quantization: ``"gguf"``: the linear layers run on the Q8_0 / Q4_1 blocks of the
            GGUF file ``model`` was converted from (``quantized_from``); None: on the
            folder's weights.
        quantized_from: The GGUF file, with ``quantization="gguf"``.
        max_logprobs: The most ``logprobs`` / ``prompt_logprobs`` a request may ask for per
            token (``--max-logprobs``); -1: the whole vocabulary.
        enable_sleep_mode: Whether ``LLM.sleep()`` / ``wake_up()`` may free and allocate
            again the workers' KV cache and weights (vLLM's flag).
    """

    model: str
    tokenizer: str
    served_model_name: str
    architecture: str
    dtype: str
    max_model_len: int
    vocab_size: int
    eos_token_id: int | None = None
    generation_config: dict[str, Any] = field(default_factory=dict)
    sampling_defaults: dict[str, Any] = field(default_factory=dict)
    served_model_names: list[str] = field(default_factory=list)
    load_format: str = "auto"
    quantization: str | None = None
    quantized_from: str | None = None
    # --runner pooling: how hidden states are pooled (None: a generative model).
    pooler_config: PoolerConfig | None = None
    max_logprobs: int = 20
    # vLLM's: the offline LLM may sleep() (free the KV cache, and the weights) and wake_up().
    enable_sleep_mode: bool = False

    def get_diff_sampling_param(self) -> dict[str, Any]:
        """vLLM's name for :attr:`sampling_defaults` (a copy)."""
        return dict(self.sampling_defaults)

    # vLLM's ModelConfig names that plugins read (a logits processor sizing its state by
    # the vocabulary, a stat logger naming the model) ------------------------------------
    @property
    def hf_config(self) -> Any:
        """The model folder's Hugging Face config (read once per process and folder)."""
        return _hf_config(self.model)

    @property
    def hf_text_config(self) -> Any:
        """The text model's config: :attr:`hf_config` itself for forkless's text models."""
        config = self.hf_config
        return getattr(config, "text_config", None) or config

    @property
    def architectures(self) -> list[str]:
        """The architecture the model was built as, in a list (vLLM's ``architectures``)."""
        return [self.architecture]

    def get_vocab_size(self) -> int:
        """:attr:`vocab_size`."""
        return self.vocab_size

    def get_hidden_size(self) -> int:
        """The model's hidden size (``hidden_size`` of :attr:`hf_text_config`)."""
        return int(self.hf_text_config.hidden_size)

    @property
    def runner_type(self) -> str:
        """``"pooling"`` or ``"generate"`` (vLLM's ``runner_type``)."""
        return "generate" if self.pooler_config is None else "pooling"


@dataclass(kw_only=True)
class CacheConfig:
    """The paged KV cache.

    Attributes:
        block_size: Tokens per block.
        gpu_memory_utilization: Fraction of device memory forkless may use (GPUs).
        kv_cache_memory: Explicit KV-cache size in bytes; overrides the utilization.
        enable_prefix_caching: Share the KV of common prompt prefixes.
        prefix_caching_hash_algo: How prefix-cache blocks are hashed (see
            ``forkless.core.block_pool.HASH_ALGOS``).
        cache_dtype: ``--kv-cache-dtype``: ``"auto"`` (the model dtype), ``"fp8"`` or
            ``"fp8_e4m3"`` (float8 e4m3, per-layer scales of 1.0, as vLLM without
            checkpoint scales); the attention backend must list it in
            ``supported_kv_cache_dtypes``.
        num_blocks: Set by the engine core once the workers have sized the cache.
    """

    block_size: int = 16
    cache_dtype: str = "auto"
    gpu_memory_utilization: float = 0.9
    kv_cache_memory: int | None = None
    enable_prefix_caching: bool = True
    prefix_caching_hash_algo: str = "sha256"
    num_blocks: int | None = None

    @property
    def num_gpu_blocks(self) -> int | None:
        """vLLM's name for :attr:`num_blocks` (whatever the device). In the API server it
        is set once the engine core is ready: a stat logger reads it in
        ``log_engine_initialized``, not in its constructor (built before the engine starts)."""
        return self.num_blocks


@dataclass(kw_only=True)
class DeviceConfig:
    """Where and how the model runs.

    Attributes:
        device_type: The platform's torch device type (``"cpu"``, ``"cuda"``...).
        attention_backend: ``--attention-backend`` name, or ``None`` for the platform's.
        enforce_eager: Never capture graphs / compile.
        seed: Seeds every process's global generators.
        num_threads: When set, workers call ``torch.set_num_threads`` with it.
    """

    device_type: str = "cpu"
    attention_backend: str | None = None
    enforce_eager: bool = False
    seed: int = 0
    num_threads: int | None = None

    @property
    def device(self) -> Any:
        """``torch.device(device_type)`` (vLLM's ``device``; imports torch)."""
        import torch

        return torch.device(self.device_type)


@dataclass(kw_only=True)
class ParallelConfig:
    """How the engine core reaches its workers.

    Attributes:
        distributed_executor_backend: ``"uni"``, ``"mp"``, ``"ray"`` or an ``Executor`` class path.
        world_size: Number of workers (``tensor_parallel_size * pipeline_parallel_size``).
        tensor_parallel_size: Ranks each layer is split across (``-tp``).
        pipeline_parallel_size: Stages the layers are split into (``-pp``).
        worker_cls: Worker class path; ``"auto"`` (vLLM's spelling) leaves the choice
            to the platform, whose ``check_and_update_config`` sets it (a ``"auto"``
            left over means the platform's ``worker_cls`` attribute).
        worker_extension_cls: A class path whose methods are added to the worker class
            (vLLM's), so that ``collective_rpc`` can call them by name; ``""``: none.
        device_communicator_cls: Collective-communication helper class path, chosen by
            the platform; ``None`` when the device needs none (one worker).
    """

    distributed_executor_backend: str = "uni"
    world_size: int = 1
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    worker_cls: str = "auto"
    worker_extension_cls: str = ""
    device_communicator_cls: str | None = None

    @property
    def data_parallel_size(self) -> int:
        """vLLM's data-parallel degree: forkless serves one engine per server (``-dp 1``)."""
        return 1


@dataclass(kw_only=True)
class LoRAConfig:
    """Multi-LoRA serving (``--enable-lora``).

    Attributes:
        max_loras: Adapters one step may use (``--max-loras``): the worker preallocates
            this many weight slots per adapted layer.
        max_lora_rank: Largest adapter rank accepted (``--max-lora-rank``); slots are
            padded to it.
        max_cpu_loras: Adapters the worker keeps loaded on the host
            (``--max-cpu-loras``); the least recently used one is evicted.
    """

    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: int = 1


#: vLLM's ``cudagraph_mode`` values forkless runs: no graphs; decode steps captured whole
#: (prefill and mixed steps eager); and those plus prefill and mixed steps as graphs split
#: around attention (the default, as in vLLM).
CUDAGRAPH_MODES = ("NONE", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
CUDAGRAPH_MODE_DEFAULT = "FULL_AND_PIECEWISE"


@dataclass(kw_only=True)
class CompilationConfig:
    """The part of vLLM's ``--compilation-config`` forkless has (there is no torch.compile
    here; ``--enforce-eager`` turns every CUDA graph off).

    Attributes:
        custom_ops: Which custom ops (``forkless.ops``) run their device implementation
            rather than ``forward_native``: ``"all"``, ``"none"``, ``"+op"``, ``"-op"``, as
            ``FORKLESS_CUSTOM_OPS`` takes them (which it replaces when given).
        cudagraph_mode: One of :data:`CUDAGRAPH_MODES` (upper case).
    """

    custom_ops: list[str] = field(default_factory=list)
    cudagraph_mode: str = CUDAGRAPH_MODE_DEFAULT


@dataclass(kw_only=True)
class EngineConfig:
    """Everything an engine process needs, as plain data.

    Attributes:
        model_config: The model.
        cache_config: The KV cache.
        scheduler_config: Batching limits and policy (``forkless.core``).
        device_config: Device, attention backend, seed.
        parallel_config: Executor and workers.
        scheduler_cls: ``--scheduler-cls`` class path, or ``None`` for the built-in.
        logits_processors: ``--logits-processors`` class paths.
        lora_config: Multi-LoRA serving, or ``None`` without ``--enable-lora``.
        speculative_config: Speculative decoding (``--speculative-config``), or ``None``.
        structured_outputs_config: Structured outputs (``--structured-outputs-config``);
            ``None``: the defaults (backend ``auto``).
        kv_transfer_config: The KV connector (``--kv-transfer-config``), or ``None``.
        compilation_config: ``--compilation-config`` (its ``custom_ops``), or ``None``.
        reasoning_config: The reasoning markers ``thinking_token_budget`` counts from and
            forces (``--reasoning-config``, defaulting to ``--reasoning-parser``'s), or
            ``None`` with neither flag.
    """

    model_config: ModelConfig
    cache_config: CacheConfig
    scheduler_config: SchedulerConfig
    device_config: DeviceConfig
    parallel_config: ParallelConfig
    scheduler_cls: str | None = None
    logits_processors: list[str] = field(default_factory=list)
    lora_config: LoRAConfig | None = None
    speculative_config: SpeculativeConfig | None = None
    structured_outputs_config: StructuredOutputsConfig | None = None
    kv_transfer_config: KVTransferConfig | None = None
    compilation_config: CompilationConfig | None = None
    reasoning_config: ReasoningConfig | None = None

    def to_builtins(self) -> dict[str, Any]:
        """Plain dicts/lists/scalars, ready for msgpack or JSON."""
        return msgspec.to_builtins(self)

    @classmethod
    def from_builtins(cls, data: Any) -> EngineConfig:
        """Rebuild a config from :meth:`to_builtins` output (re-validating it)."""
        return msgspec.convert(data, cls)


# vLLM's name for the whole configuration: plugins ported from vLLM annotate with it
# (``from vllm.config import VllmConfig`` -> ``from forkless.config import VllmConfig``).
VllmConfig = EngineConfig


def _check_backend_module(path: str, name: str) -> None:
    """Refuse an attention backend whose module cannot be found, here rather than in
    every worker: found, not imported (it may import torch or a device library), so
    only its parent packages are imported.

    Raises:
        ValueError: Naming the backend, its path, and the plugin that registered it.
    """
    import importlib.util

    from forkless.attention.registry import available_attention_backends, describe_attention_backend
    from forkless.plugins import canonical_path

    module = canonical_path(path).split(":", 1)[0]
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package is missing, or fails to import
        found = False
    if not found:
        what = (describe_attention_backend(name) if name in available_attention_backends()
                else f"attention backend {name!r} -> {path!r}")
        raise ValueError(f"{what}: module {module!r} cannot be found")


@dataclass
class EngineArgs:
    """Engine arguments, named like vLLM's (``--max-model-len`` is ``max_model_len``).

    ``LLM(model, **kwargs)`` passes its keyword arguments here; the CLI fills it from
    :meth:`add_cli_args` / :meth:`from_cli_args`.
    """


    #: The CPU default of ``long_prefill_token_threshold`` (0: vLLM's rule, no cap).
    cpu_long_prefill_token_threshold: ClassVar[int] = 0
    #: The CPU default of ``long_prefill_min_prompt_tokens`` (0: the threshold alone decides).
    cpu_long_prefill_min_prompt_tokens: ClassVar[int] = 0
    #: The CPU default of ``long_prefill_time_share`` (0: off).
    cpu_long_prefill_time_share: ClassVar[float] = 0.0
    #: The CPU default of ``max_running_seqs_per_request`` (0: no limit, as vLLM).
    cpu_max_running_seqs_per_request: ClassVar[int] = 0
    #: The CPU default of ``max_prefill_tokens_per_client`` (0: no limit, as vLLM).
    cpu_max_prefill_tokens_per_client: ClassVar[int] = 0

    model: str | None = None
    tokenizer: str | None = None
    # One name or several (vLLM's --served-model-name A B: all accepted, the first reported).
    served_model_name: str | list[str] | None = None
    dtype: str = "auto"
    max_model_len: int | None = None
    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    kv_cache_memory: int | None = None
    kv_cache_dtype: str = "auto"
    enable_prefix_caching: bool = True
    prefix_caching_hash_algo: str = "sha256"
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None
    enable_chunked_prefill: bool = True
    # None: cpu_long_prefill_token_threshold on CPU (0 offline, so vLLM's rule; the server's
    # AsyncEngineArgs caps), vLLM's rule elsewhere.
    long_prefill_token_threshold: int | None = None
    # None: cpu_long_prefill_min_prompt_tokens on CPU when long prefills are capped, else 0.
    long_prefill_min_prompt_tokens: int | None = None
    max_num_partial_prefills: int | None = None  # None: no limit
    max_long_partial_prefills: int = 1
    # None: cpu_long_prefill_time_share on CPU when long prefills are capped, else 0.
    long_prefill_time_share: float | None = None
    # None: cpu_max_running_seqs_per_request on CPU, else 0 (no limit).
    max_running_seqs_per_request: int | None = None
    # None: cpu_max_prefill_tokens_per_client on CPU, else 0 (no limit).
    max_prefill_tokens_per_client: int | None = None
    scheduling_policy: str = "fcfs"
    # --stream-interval (vLLM's): a stream's outputs come every this many tokens at least.
    stream_interval: int = 1
    scheduler_cls: str | type | None = None
    logits_processors: str | type | list[str | type] | None = None
    attention_backend: str | None = None
    load_format: str = "auto"
    quantization: str | None = None
    seed: int = 0
    enforce_eager: bool = False
    async_scheduling: bool = False
    distributed_executor_backend: str | type = "uni"
    # -tp / -pp (vLLM's): workers = tp x pp; more than one runs on the mp executor.
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    num_threads: int | None = None
    # Read by AsyncLLM.from_engine_args (the periodic throughput line; /metrics stays).
    disable_log_stats: bool = False
    enable_lora: bool = False
    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None  # None: max_loras
    # --speculative-config: a JSON object (string) or a dict, vLLM's keys.
    speculative_config: str | dict[str, Any] | None = None
    # --structured-outputs-config: a JSON object (string) or a dict, vLLM's keys.
    structured_outputs_config: str | dict[str, Any] | None = None
    # --reasoning-parser / --reasoning-parser-plugin (the server's flags; LLM(reasoning_parser=)
    # as vLLM's): the structured-outputs config's keys of the same names, so that a
    # constraint starts after the reasoning.
    reasoning_parser: str | None = None
    reasoning_parser_plugin: str | None = None
    # --reasoning-config: a JSON object (string), a dict or a ReasoningConfig, vLLM's keys
    # (reasoning_start_str, reasoning_end_str, reasoning_parser): thinking_token_budget's markers.
    reasoning_config: str | dict[str, Any] | ReasoningConfig | None = None
    # --kv-transfer-config: a JSON object (string), a dict or a KVTransferConfig, vLLM's keys.
    kv_transfer_config: str | dict[str, Any] | KVTransferConfig | None = None
    # --compilation-config: a JSON object (string) or a dict; only vLLM's custom_ops key.
    compilation_config: str | dict[str, Any] | None = None
    # --runner / --convert / --pooler-config (vLLM's): pooling models.
    runner: str = "auto"
    convert: str = "auto"
    pooler_config: str | dict[str, Any] | None = None
    # --generation-config (vLLM's): "auto" (the model folder's generation_config.json gives
    # the sampling defaults), "vllm" (none: forkless's), or a folder holding one.
    generation_config: str = "auto"
    # --override-generation-config: a JSON object (string) or a dict over those defaults.
    override_generation_config: str | dict[str, Any] | None = None
    # --max-logprobs (vLLM's): the most logprobs a request may ask for; -1: the vocabulary.
    max_logprobs: int = 20
    # vLLM's, accepted for its scripts: nothing to allow (forkless runs no code from model folders).
    trust_remote_code: bool = False
    # vLLM's --kv-cache-memory-bytes: the same as kv_cache_memory.
    kv_cache_memory_bytes: int | None = None
    # vLLM's: the worker class (a Worker subclass path, "pkg.module.Class" or "pkg.module:Class"),
    # whose public methods LLM.collective_rpc calls by name; "auto": the platform's. Checked
    # where the workers start (this process imports no worker code).
    worker_cls: str = "auto"
    # vLLM's: a class ("pkg.module.Class") whose methods are mixed into the worker class, for
    # LLM.collective_rpc to call by name without replacing the worker; "": none. Resolved
    # where the workers start, and a name the worker class has already is refused there.
    worker_extension_cls: str = ""
    # vLLM's: LLM.sleep() / wake_up() may free and allocate again the KV cache and weights.
    # No CLI flag: the server has no sleep endpoints.
    enable_sleep_mode: bool = False
    # vLLM's: LLM.start_profile() / stop_profile() run torch's profiler on every worker:
    # {"profiler": "torch", "torch_profiler_dir": DIR} and PROFILER_FLAGS. No CLI flag: the
    # server has no profiling endpoints.
    profiler_config: dict[str, Any] | None = None
    # vLLM's arguments for what forkless does one way only: their values that ask for that
    # way are accepted (VLLM_ONLY_DEFAULTS), any other is an error saying why.
    tokenizer_mode: str = "auto"
    revision: str | None = None
    tokenizer_revision: str | None = None
    hf_token: str | bool | None = None
    hf_overrides: dict[str, Any] | None = None
    skip_tokenizer_init: bool = False
    swap_space: float | None = None
    cpu_offload_gb: float = 0
    data_parallel_size: int = 1
    mm_processor_kwargs: dict[str, Any] | None = None
    allowed_local_media_path: str = ""
    disable_custom_all_reduce: bool = False

    # ------------------------------------------------------------------------- CLI

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser, model_positional: bool = True) -> argparse.ArgumentParser:
        """Add the engine flags to ``parser``.

        Args:
            parser: The (sub-)command's parser.
            model_positional: ``MODEL`` is an optional positional argument (``serve``,
                ``generate``); otherwise it is ``--model``.

        Returns:
            The same parser.
        """
        d = EngineArgs()
        if model_positional:
            parser.add_argument("model", nargs="?", default=None, metavar="MODEL",
                                help="model folder or .gguf file (default: the embedded SmolLM2-135M-Instruct)")
            # vLLM takes the model as a flag too (its Docker image's usual form).
            parser.add_argument("--model", dest="model_option", default=None, metavar="MODEL",
                                help="the same as MODEL")
        else:
            parser.add_argument("--model", default=None, help="model folder or .gguf file")
        g = parser.add_argument_group("engine")
        g.add_argument("--tokenizer", default=None, help="tokenizer folder (default: the model's)")
        g.add_argument("--trust-remote-code", action="store_true",
                       help="accepted for vLLM's command lines: forkless never runs code from a model folder "
                            "(its models are its own or plugins'), so there is nothing to allow")
        g.add_argument("--served-model-name", nargs="+", default=None, metavar="NAME",
                       help="names clients may give in 'model' (the first is reported; default: MODEL as given)")
        g.add_argument("--generation-config", default=d.generation_config, metavar="auto|vllm|FOLDER",
                       help="where requests' sampling defaults come from: auto = the model's generation_config.json "
                            "(temperature, top_p, top_k, min_p, repetition_penalty, max_new_tokens), vllm = none "
                            "(forkless's own defaults), or a folder holding a generation_config.json")
        g.add_argument("--override-generation-config", default=None, metavar="JSON",
                       help='sampling defaults over --generation-config\'s, e.g. \'{"temperature": 0.5}\'')
        g.add_argument("--kv-cache-memory-bytes", type=parse_human_int, default=None,
                       help="vLLM's name of --kv-cache-memory")
        vllm = parser.add_argument_group("vLLM's engine flags for what forkless does one way only "
                                         "(their other values are refused, saying why)")
        vllm.add_argument("--tokenizer-mode", default=d.tokenizer_mode, help="auto (or hf): the folder's tokenizer")
        vllm.add_argument("--revision", default=None, help="none: local folders have no hub revision")
        vllm.add_argument("--tokenizer-revision", default=None, help="none: local folders have no hub revision")
        vllm.add_argument("--swap-space", type=float, default=None,
                          help="0 or 4 (vLLM's default): preempted requests are recomputed, never swapped")
        vllm.add_argument("--cpu-offload-gb", type=float, default=d.cpu_offload_gb, help="0: no weight offloading")
        vllm.add_argument("--data-parallel-size", "-dp", type=int, default=d.data_parallel_size,
                          help="1: run several servers behind a load balancer instead")
        vllm.add_argument("--disable-custom-all-reduce", action="store_true",
                          help="accepted: forkless has no custom all-reduce (torch.distributed's runs)")
        vllm.add_argument("--skip-tokenizer-init", action="store_true", help="refused: the tokenizer always loads")
        g.add_argument("--max-logprobs", type=int, default=d.max_logprobs,
                       help="the most logprobs / top_logprobs / prompt_logprobs a request may ask for per token "
                            "(-1: the whole vocabulary; a request's -1 asks for the whole vocabulary)")
        g.add_argument("--dtype", default=d.dtype, choices=(*DTYPE_CHOICES, *DTYPE_ALIASES),
                       help="weights/activations dtype; auto = float32 on CPU (a pooling model: bfloat16 where the "
                            "CPU has AVX512-BF16 or AMX, as vLLM downcasts float32 pooling models), the config's "
                            "dtype elsewhere")
        g.add_argument("--max-model-len", type=parse_model_len, default=None,
                       help="longest prompt + output, as vLLM takes it (4096, 4k = 4000, 4K = 4096, 25.6k; "
                            "-1 or auto: the default, the model's context length, on CPU at most "
                            f"{CPU_DEFAULT_MAX_MODEL_LEN_CAP})")
        g.add_argument("--block-size", type=int, default=d.block_size, help="tokens per KV-cache block")
        g.add_argument("--gpu-memory-utilization", type=float, default=d.gpu_memory_utilization,
                       help="fraction of device memory to use (model + KV cache)")
        g.add_argument("--kv-cache-memory", type=parse_human_int, default=None,
                       help="KV-cache size in bytes (overrides --gpu-memory-utilization)")
        g.add_argument("--kv-cache-dtype", default=d.kv_cache_dtype, choices=KV_CACHE_DTYPE_CHOICES,
                       help="KV-cache storage: auto = the model dtype; fp8 / fp8_e4m3 = float8 e4m3, "
                            "1 byte per element (twice the blocks), scale 1.0 (the triton backend on "
                            "CUDA, or --attention-backend torch)")
        g.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction,
                       default=d.enable_prefix_caching, help="reuse the KV cache of shared prompt prefixes")
        g.add_argument("--prefix-caching-hash-algo", default=d.prefix_caching_hash_algo, choices=HASH_ALGOS,
                       help="prefix-cache block hash: sha256 (collision-resistant), sha256_cbor "
                            "(reproducible in other languages), builtin (fast, trusted tenants only)")
        g.add_argument("--enable-sleep-mode", action="store_true", default=d.enable_sleep_mode,
                       help="allow sleep / wake_up (LLM, AsyncLLM; the server's /sleep and /wake_up with "
                            "FORKLESS_SERVER_DEV_MODE=1) to free and allocate the KV cache and weights")
        g.add_argument("--max-num-seqs", type=int, default=d.max_num_seqs, help="most requests running at once")
        g.add_argument("--max-num-batched-tokens", type=parse_human_int, default=None, help="token budget of one step")
        g.add_argument("--stream-interval", type=int, default=d.stream_interval, metavar="N",
                       help="a stream's chunks carry at least N new tokens (its first and last at once; a "
                            "request's stream_interval can only raise it); fewer chunks cost the server less "
                            "per token (default 1: every token, as vLLM)")
        g.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction,
                       default=d.enable_chunked_prefill, help="split long prompts across steps")
        g.add_argument("--long-prefill-token-threshold", type=int, default=None,
                       help="a prefill with more tokens left than this is long and gets at most this "
                            f"many tokens per step; 0: no cap (default: {CPU_DEFAULT_LONG_PREFILL_TOKEN_THRESHOLD} "
                            "for forkless serve on CPU; otherwise 0, or 4%% of --max-model-len with "
                            "--max-num-partial-prefills > 1, as vLLM)")
        g.add_argument("--long-prefill-min-prompt-tokens", type=int, default=None,
                       help="a prompt of at most this many tokens is never long: it is scheduled whole, "
                            "not chunked at --long-prefill-token-threshold; 0: the threshold alone decides "
                            f"(default: {CPU_DEFAULT_LONG_PREFILL_MIN_PROMPT_TOKENS} for forkless serve on CPU, "
                            "else 0; forkless only)")
        g.add_argument("--max-num-partial-prefills", type=int, default=None,
                       help="most requests prefilling in one step (default: no limit; vLLM: 1, which its "
                            "engine does not enforce)")
        g.add_argument("--max-long-partial-prefills", type=int, default=d.max_long_partial_prefills,
                       help="most long prompts prefilling in one step; shorter ones behind them go first "
                            "(default: 1, as vLLM)")
        g.add_argument("--long-prefill-time-share", type=float, default=None,
                       help="while other requests run, long prefills take at most this share of the "
                            "step time, in chunks sized to it (others then take at most 1/(1-share) "
                            f"times as long); 0: off (default: {CPU_DEFAULT_LONG_PREFILL_TIME_SHARE} for "
                            "forkless serve on CPU, else 0; forkless only)")
        g.add_argument("--max-running-seqs-per-request", type=int, default=None,
                       help="most sequences of one request (its prompts x n) running at once; its "
                            "others wait while requests behind them run; 0: no limit (default: "
                            f"{CPU_DEFAULT_MAX_RUNNING_SEQS_PER_REQUEST} for forkless serve on CPU, else 0; "
                            "forkless only)")
        g.add_argument("--max-prefill-tokens-per-client", type=int, default=None,
                       help="while requests of several clients (the OpenAI user field, else the peer "
                            "address) are in the engine, prompt tokens one client computes a step on "
                            "average (twice this at most in one step); its other prompts wait while "
                            "other clients' are admitted; 0: no limit (default: "
                            f"{CPU_DEFAULT_MAX_PREFILL_TOKENS_PER_CLIENT} for forkless serve on CPU, "
                            "else 0; forkless only)")
        g.add_argument("--scheduling-policy", default=d.scheduling_policy, choices=SCHEDULING_POLICIES,
                       help="fcfs, or priority (lower request priority runs first)")
        g.add_argument("--scheduler-cls", default=None,
                       help="scheduler class path pkg.mod:Class (internal interface)")
        g.add_argument("--logits-processors", default=None,
                       help="comma-separated logits processor class paths")
        g.add_argument("--attention-backend", default=None, help="registered attention backend name")
        g.add_argument("--load-format", default=d.load_format, choices=LOAD_FORMAT_CHOICES,
                       help="auto reads the weights; dummy uses random weights")
        g.add_argument("--quantization", "-q", default=None, choices=QUANTIZATION_CHOICES,
                       help="gguf: a GGUF model's Q8_0 / Q4_1 matrices stay quantized in memory and the linear "
                            "layers read them directly (CPU, float32 activations; default: the file is "
                            "dequantized to --dtype)")
        g.add_argument("--seed", type=int, default=d.seed, help="global random seed")
        g.add_argument("--enforce-eager", action="store_true", help="never capture graphs or compile")
        g.add_argument("--async-scheduling", action="store_true",
                       help="prepare step N+1 on the host while the device runs step N")
        g.add_argument("--distributed-executor-backend", default=d.distributed_executor_backend,
                       help="uni, mp, ray (one Ray actor per worker), or an Executor class path (uni becomes mp "
                            "with more than one worker)")
        g.add_argument("--tensor-parallel-size", "-tp", type=int, default=d.tensor_parallel_size,
                       help="split every layer across this many worker processes (one device each)")
        g.add_argument("--pipeline-parallel-size", "-pp", type=int, default=d.pipeline_parallel_size,
                       help="split the layers into this many stages, one worker process each (x -tp)")
        g.add_argument("--disable-log-stats", action="store_true",
                       help="keep no statistics, as vLLM: no periodic throughput line and no forkless: series at "
                            "/metrics (which still answers); stat logger plugins, if any, still get them, with the "
                            "/metrics series")
        g.add_argument("--structured-outputs-config", default=None, metavar="JSON",
                       help='structured outputs, vLLM\'s keys: {"backend": "auto"} (auto, xgrammar, guidance or a '
                            'class path; also disable_fallback, disable_any_whitespace, '
                            'disable_additional_properties, reasoning_parser (what --reasoning-parser sets), '
                            'reasoning_parser_plugin, enable_in_reasoning)')
        g.add_argument("--speculative-config", default=None, metavar="JSON",
                       help='speculative decoding, vLLM\'s keys: {"method": "ngram", "num_speculative_tokens": 4, '
                            '"prompt_lookup_max": 4} (method: a registered proposer or a class path)')
        g.add_argument("--kv-transfer-config", default=None, metavar="JSON",
                       help='KV connector, vLLM\'s keys: {"kv_connector": "SharedStorageConnector", "kv_role": '
                            '"kv_both", "kv_connector_extra_config": {"shared_storage_path": "/tmp/kv"}} '
                            "(kv_role: kv_producer, kv_consumer, kv_both; also kv_connector_module_path)")
        g.add_argument("--compilation-config", default=None, metavar="JSON",
                       help='vLLM\'s keys custom_ops (which layer ops run their device kernels, e.g. '
                            '{"custom_ops": ["none", "+rms_norm"]}: all, none, +op, -op; ops: rms_norm, '
                            "rotary_embedding, silu_and_mul; replaces FORKLESS_CUSTOM_OPS) and cudagraph_mode "
                            "(FULL_AND_PIECEWISE, the default: decode steps as whole CUDA graphs, prefill and "
                            "mixed steps as graphs split around attention; FULL_DECODE_ONLY; NONE)")
        g.add_argument("--runner", default=d.runner, choices=RUNNERS,
                       help="generate, or pooling (embeddings, classification, scores); auto: pooling for "
                            "encoders and *ForSequenceClassification models or with --convert")
        g.add_argument("--convert", default=d.convert, choices=CONVERTS,
                       help="pool a generative model: embed (last token, normalised) or classify "
                            "(a *ForSequenceClassification checkpoint's score head)")
        g.add_argument("--pooler-config", default=None, metavar="JSON",
                       help='pooling, vLLM\'s keys: {"pooling_type": "MEAN", "normalize": true} (pooling_type: '
                            "LAST, ALL, CLS, MEAN; also use_activation, dimensions, logit_bias)")
        g.add_argument("--enable-lora", action="store_true", help="serve LoRA adapters (PEFT folders)")
        g.add_argument("--max-loras", type=int, default=d.max_loras,
                       help="LoRA adapters one step may use (weight slots on the device)")
        g.add_argument("--max-lora-rank", type=int, default=d.max_lora_rank, help="largest LoRA rank accepted")
        g.add_argument("--max-cpu-loras", type=int, default=None,
                       help="LoRA adapters kept loaded on the host, least recently used evicted "
                            "(default: --max-loras)")
        return parser

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> EngineArgs:
        """Build from parsed flags (attributes that the parser lacks keep their defaults).

        Raises:
            ValueError: ``MODEL`` and ``--model`` name different models.
        """
        option = getattr(args, "model_option", None)
        if option is not None:
            if args.model is not None and args.model != option:
                raise ValueError(f"MODEL {args.model!r} and --model {option!r} disagree: give one")
            args.model = option
        if getattr(args, "trust_remote_code", False):
            logger.info("--trust-remote-code: nothing to allow, forkless never runs code from a model folder")
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in vars(args).items() if k in names})

    # ------------------------------------------------------------------- resolution

    def create_engine_config(self) -> EngineConfig:
        """Resolve the model and validate every value.

        Returns:
            The engine configuration.

        Raises:
            ValueError: A flag has an invalid value (the message names the flag, the
                value and what is expected), the model cannot be found, or its
                architecture is not supported (the message lists the supported ones).
            ImportError, TypeError: A ``--scheduler-cls`` or ``--logits-processors``
                class does not import, or does not subclass its interface (see
                :meth:`check_class_paths`, which runs before the model is resolved).
        """
        self._validate_flags()
        # Before the model is resolved (a first start converts a GGUF for seconds).
        self.check_class_paths()
        from forkless.model_loader.default_model import resolve_model_path
        from forkless.platforms import current_platform

        try:  # a bad --attention-backend fails here, not later inside a worker
            # (by name: the platform's get_attn_backend_cls runs in the workers, with torch)
            backend_path = current_platform.attention_backend_path(self.attention_backend)
        except KeyError as exc:
            raise ValueError(f"--attention-backend: {exc}") from None
        _check_backend_module(backend_path, current_platform.resolved_attention_backend(self.attention_backend))
        if self.tokenizer and not Path(self.tokenizer).expanduser().exists():
            raise ValueError(f"--tokenizer {self.tokenizer!r} is not a local folder (nothing is downloaded): give "
                             "a tokenizer folder, or leave it out for the model's own")
        model_path = resolve_model_path(self.model)
        hf = _read_json(model_path / "config.json")
        architecture = _check_architecture(hf)
        device_type = current_platform.device_type
        pooler, st_max_len = self._pooling(hf, model_path, architecture)
        max_model_len = _resolve_max_model_len(
            self.max_model_len if self.max_model_len is not None or st_max_len is None
            else min(st_max_len, _model_limit(hf) or st_max_len), hf, device_type)
        generation_config = _generation_config(model_path)
        batched = self.max_num_batched_tokens
        if batched is None:
            budget = CPU_DEFAULT_MAX_NUM_BATCHED_TOKENS if device_type == "cpu" else 8192
            batched = budget if self.enable_chunked_prefill else max(budget, max_model_len)
        threshold = self.long_prefill_token_threshold
        if threshold is None:
            # 0 elsewhere: SchedulerConfig applies vLLM's 4 % rule when partial prefills > 1.
            threshold = 0
            if device_type == "cpu" and self.enable_chunked_prefill and self.cpu_long_prefill_token_threshold:
                threshold = min(self.cpu_long_prefill_token_threshold, max_model_len)
        share = self.long_prefill_time_share
        if share is None:
            share = self.cpu_long_prefill_time_share if device_type == "cpu" and threshold else 0.0
        min_prompt = self.long_prefill_min_prompt_tokens
        if min_prompt is None:
            min_prompt = self.cpu_long_prefill_min_prompt_tokens if device_type == "cpu" and threshold else 0
        per_request = self.max_running_seqs_per_request
        if per_request is None:
            per_request = self.cpu_max_running_seqs_per_request if device_type == "cpu" else 0
        per_client = self.max_prefill_tokens_per_client
        if per_client is None:
            per_client = self.cpu_max_prefill_tokens_per_client if device_type == "cpu" else 0
        chunked, prefix_caching = self.enable_chunked_prefill, self.enable_prefix_caching
        if pooler is not None:
            # A pooling request runs its whole prompt in one step (vLLM turns chunked
            # prefill off for pooling too), reads no prefix cache and never decodes.
            chunked = prefix_caching = False
            if self.max_num_batched_tokens is None and device_type == "cpu":
                batched = CPU_POOLING_MAX_NUM_BATCHED_TOKENS
            batched = max(batched, max_model_len)
            threshold, share, per_client, min_prompt = 0, 0.0, 0, 0
        try:
            scheduler_config = SchedulerConfig(
                max_model_len=max_model_len,
                max_num_seqs=self.max_num_seqs,
                max_num_batched_tokens=batched,
                policy=self.scheduling_policy,
                enable_chunked_prefill=chunked,
                long_prefill_token_threshold=threshold,
                long_prefill_min_prompt_tokens=min_prompt,
                max_num_partial_prefills=self.max_num_partial_prefills,
                max_long_partial_prefills=self.max_long_partial_prefills,
                long_prefill_time_share=share,
                max_running_seqs_per_request=per_request,
                max_prefill_tokens_per_client=per_client,
                # The pooling runner says it cannot; the engine core then warns and steps
                # synchronously.
                async_scheduling=self.async_scheduling,
                stream_interval=self.stream_interval,
            )
        except ValueError as exc:  # a combination of flags (each was checked alone above)
            raise ValueError(f"scheduler flags: {exc}") from None
        if share and not (scheduler_config.enable_chunked_prefill and scheduler_config.long_prefill_token_threshold):
            raise ValueError(
                f"--long-prefill-time-share {share} limits long prefills, and there are none: it needs "
                "--enable-chunked-prefill and --long-prefill-token-threshold > 0"
            )
        if min_prompt and not (scheduler_config.enable_chunked_prefill
                               and scheduler_config.long_prefill_token_threshold):
            raise ValueError(
                f"--long-prefill-min-prompt-tokens {min_prompt} exempts prompts from the long-prefill "
                "limits, and there are none: it needs --enable-chunked-prefill and "
                "--long-prefill-token-threshold > 0"
            )
        served_names = _served_names(self.served_model_name) or [_default_served_name(self.model, model_path)]
        config = EngineConfig(
            model_config=ModelConfig(
                model=str(model_path),
                tokenizer=str(Path(self.tokenizer).expanduser()) if self.tokenizer else str(model_path),
                served_model_name=served_names[0],
                served_model_names=served_names,
                architecture=architecture,
                dtype=_resolve_dtype_name(self.dtype, hf, device_type, pooling=pooler is not None),
                max_model_len=max_model_len,
                vocab_size=int(hf.get("vocab_size") or _text_config(hf).get("vocab_size")),
                eos_token_id=_primary_eos(generation_config, hf),
                generation_config=generation_config,
                sampling_defaults=self._sampling_defaults(model_path),
                load_format=self.load_format,
                quantization=self.quantization,
                quantized_from=self._quantized_from(model_path, device_type, pooler is not None),
                pooler_config=pooler,
                max_logprobs=self.max_logprobs,
                enable_sleep_mode=self.enable_sleep_mode,
            ),
            cache_config=CacheConfig(
                block_size=self.block_size,
                gpu_memory_utilization=self.gpu_memory_utilization,
                kv_cache_memory=self.kv_cache_memory,
                cache_dtype=self.kv_cache_dtype,
                enable_prefix_caching=prefix_caching,
                prefix_caching_hash_algo=self.prefix_caching_hash_algo,
            ),
            scheduler_config=scheduler_config,
            device_config=DeviceConfig(
                device_type=device_type,
                attention_backend=self.attention_backend,
                enforce_eager=self.enforce_eager,
                seed=self.seed,
                num_threads=self.num_threads,
            ),
            parallel_config=self._parallel_config(hf, pooler is not None),
            scheduler_cls=_as_path(self.scheduler_cls),
            logits_processors=_split_paths(self.logits_processors),
            lora_config=LoRAConfig(
                max_loras=self.max_loras,
                max_lora_rank=self.max_lora_rank,
                max_cpu_loras=self.max_cpu_loras or self.max_loras,
            ) if self.enable_lora else None,
            speculative_config=self._speculative_config(model_path),
            structured_outputs_config=self._structured_outputs_config(),
            kv_transfer_config=self._kv_transfer_config(pooler is not None),
            compilation_config=self._compilation_config(),
            reasoning_config=self._reasoning_config(),
        )
        current_platform.verify_model_arch(architecture)
        current_platform.check_and_update_config(config)
        return config

    def _quantized_from(self, model_path: Path, device_type: str, pooling: bool) -> str | None:
        """The GGUF file ``--quantization gguf`` reads, checked against the other flags.

        Raises:
            ValueError: The model was not converted from a GGUF file, or a flag asks for
                what the GGUF layers do not run (the message names it).
        """
        if self.quantization is None:
            return None
        from forkless.model_loader.gguf_quantized import source_gguf

        source = source_gguf(model_path)
        if source is None:
            raise ValueError(f"--quantization gguf reads the matrices of a GGUF file, and {self.model or model_path} "
                             "is not one (nor a folder forkless converted from one): pass the .gguf file")
        checks = [(device_type != "cpu", f"the {device_type} platform (its kernels are the CPU's)"),
                  (self.dtype not in ("auto", "float32"),
                   f"--dtype {self.dtype} (activations are float32: leave --dtype auto or float32)"),
                  (self.tensor_parallel_size * self.pipeline_parallel_size > 1, "tensor or pipeline parallelism"),
                  (self.enable_lora, "--enable-lora"), (pooling, "--runner pooling"),
                  (self.load_format == "dummy", "--load-format dummy")]
        for bad, what in checks:
            if bad:
                raise ValueError(f"--quantization gguf does not work with {what} yet: leave one of them out")
        return str(source)

    def _parallel_config(self, hf: dict[str, Any], pooling: bool) -> ParallelConfig:
        """``-tp`` / ``-pp`` checked against the model and the other flags.

        Raises:
            ValueError: The model's heads or widths do not split into ``-tp`` parts (the
                message names the field and the sizes that would), or a feature that does
                not work with tensor parallelism yet.
        """
        tp, pp = self.tensor_parallel_size, self.pipeline_parallel_size
        backend = _as_path(self.distributed_executor_backend)
        if pp > 1:
            layers = int(hf.get("num_hidden_layers") or _text_config(hf).get("num_hidden_layers") or 0)
            if layers < pp:
                raise _bad_flag("--pipeline-parallel-size", pp, f"at most the model's num_hidden_layers ({layers})")
        if tp > 1:
            text = {**_text_config(hf), **hf}
            heads = int(text.get("num_attention_heads") or 0)
            kv = int(text.get("num_key_value_heads") or heads)
            checks = [("num_attention_heads", heads, heads % tp == 0),
                      # Fewer KV heads than ranks: each rank keeps a copy of one KV head.
                      ("num_key_value_heads", kv, kv % tp == 0 or tp % kv == 0),
                      ("intermediate_size", int(text.get("intermediate_size") or 0),
                       int(text.get("intermediate_size") or 0) % tp == 0)]
            for name, value, ok in checks:
                if not ok:
                    fits = [n for n in range(1, value + 1) if value % n == 0] if value else []
                    raise _bad_flag("--tensor-parallel-size", tp,
                                    f"a size the model's {name} ({value}) splits into evenly"
                                    + (f": one of {', '.join(map(str, fits))}" if fits else ""))
        if tp > 1:
            from forkless.platforms import current_platform

            if not current_platform.use_all_gather():
                # vLLM's platforms that say no gather the logits to one rank; here every
                # TP rank samples from all-gathered logits (the ranks feed their own
                # tokens to the next step under async scheduling).
                raise ValueError(f"--tensor-parallel-size {tp}: the platform {current_platform.name!r} "
                                 "says use_all_gather() is False (logits gathered to one rank), which forkless "
                                 "does not do: every rank samples from all-gathered logits")
        spec = (SpeculativeConfig.from_json(self.speculative_config)
                if tp * pp > 1 and self.speculative_config is not None else None)
        if pp > 1:
            # A stage holds some layers only: these need every layer in one place.
            for on, what in ((pooling, "--runner pooling"),
                             (spec is not None and spec.method != "ngram",
                              "--speculative-config (other than method ngram)")):
                if on:
                    raise ValueError(f"{what} does not work with --pipeline-parallel-size > 1 yet: "
                                     "leave one of them out")
        if tp > 1 and spec is not None and spec.method not in ("ngram", "draft_model"):
            # ngram drafts from each request's tokens, a draft model runs whole on every
            # rank (draft_tensor_parallel_size 1): the same guesses everywhere. Another
            # proposer with a model of its own would need it split or replicated.
            raise ValueError(f"--speculative-config method {spec.method!r} does not work with "
                             "--tensor-parallel-size > 1 yet (ngram and draft_model do): leave one of them out")
        if tp * pp > 1 and backend == "uni":  # the in-process executor runs one worker
            backend = "mp"
        return ParallelConfig(distributed_executor_backend=backend, world_size=tp * pp,
                              tensor_parallel_size=tp, pipeline_parallel_size=pp, worker_cls=self.worker_cls,
                              worker_extension_cls=self.worker_extension_cls)

    def _pooling(self, hf: dict[str, Any], model_path: Path, architecture: str) -> tuple[PoolerConfig | None, int | None]:
        """``--runner`` / ``--convert`` / ``--pooler-config`` resolved (``forkless.pooling.config``), and
        the sentence-transformers ``max_seq_length`` (a cap on the default ``max_model_len``).

        Raises:
            ValueError: A combination that cannot work, or a feature pooling does not have yet.
        """
        from forkless.pooling.config import resolve_runner

        pooler, st_max_len = resolve_runner(self.runner, self.convert, self.pooler_config, hf, model_path,
                                            architecture)
        if pooler is not None:
            if self.enable_lora:
                raise ValueError("--enable-lora is not supported with --runner pooling yet")
            if self.speculative_config is not None:
                raise ValueError("--speculative-config applies to generation, not to --runner pooling")
        return pooler, st_max_len

    def _compilation_config(self) -> CompilationConfig | None:
        """``--compilation-config`` checked (``None`` without it).

        Raises:
            ValueError: Not a JSON object, a key other than ``custom_ops``, or an entry of
                ``custom_ops`` that is malformed or names an unknown op.
        """
        if self.compilation_config is None:
            return None
        data = json_object_arg(self.compilation_config, "--compilation-config")
        unknown = sorted(set(data) - {"custom_ops", "cudagraph_mode"})
        if unknown:
            raise ValueError(f"--compilation-config: {', '.join(map(repr, unknown))} is not supported: forkless "
                             "reads only 'custom_ops' and 'cudagraph_mode' (it has no torch.compile; "
                             "--enforce-eager turns the CUDA graphs off)")
        mode = data.get("cudagraph_mode", CUDAGRAPH_MODE_DEFAULT)
        if not isinstance(mode, str) or mode.upper() not in CUDAGRAPH_MODES:
            raise ValueError(f"--compilation-config: cudagraph_mode must be one of {', '.join(CUDAGRAPH_MODES)}, "
                             f"got {mode!r:.80} (vLLM's PIECEWISE and FULL are not supported: forkless "
                             "captures decode steps whole and splits only prefill and mixed steps)")
        entries = data.get("custom_ops", [])
        if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
            raise ValueError(f"--compilation-config: custom_ops must be a list of strings such as "
                             f"[\"none\", \"+rms_norm\"], got {entries!r:.80}")
        from forkless.ops.registry import op_enabled

        op_enabled(None, ",".join(entries), True, "--compilation-config custom_ops")  # checks every entry
        return CompilationConfig(custom_ops=entries, cudagraph_mode=mode.upper())

    def _sampling_defaults(self, model_path: Path) -> dict[str, Any]:
        """The sampling defaults of ``--generation-config`` and ``--override-generation-config``
        (vLLM's ``get_diff_sampling_param``).

        Raises:
            ValueError: A folder without a ``generation_config.json``, an override that is
                not a JSON object or names another key, or a value SamplingParams refuses.
        """
        source = self.generation_config
        if source == "vllm":
            config: dict[str, Any] = {}
        else:
            folder = model_path if source == "auto" else Path(source).expanduser()
            if source != "auto" and not (folder / "generation_config.json").is_file():
                raise ValueError(f"--generation-config {source!r}: expected 'auto', 'vllm' or a folder holding a "
                                 "generation_config.json")
            config = _read_json(folder / "generation_config.json")
        overrides = {}
        if self.override_generation_config is not None:
            overrides = json_object_arg(self.override_generation_config, "--override-generation-config")
            unknown = sorted(set(overrides) - set(SAMPLING_DEFAULT_KEYS))
            if unknown:
                raise ValueError(f"--override-generation-config: {', '.join(map(repr, unknown))} is not a sampling "
                                 f"default forkless takes ({', '.join(SAMPLING_DEFAULT_KEYS)})")
        config = {**config, **overrides}
        defaults = {SAMPLING_DEFAULT_KEYS[key]: config[key] for key in SAMPLING_DEFAULT_KEYS
                    if config.get(key) is not None}
        if defaults:
            try:
                SamplingParams(**defaults)
            except (ValueError, TypeError) as exc:
                raise ValueError(f"--generation-config {source!r} (with its overrides): {exc}") from None
            logger.info("requests that set none of them sample with %s (the model's generation config; "
                        "--generation-config vllm for forkless's own defaults)", defaults)
        return defaults

    def _structured_outputs_config(self) -> StructuredOutputsConfig:
        """``--structured-outputs-config`` parsed, its backend resolved (after the general
        plugins, which may register it), with ``--reasoning-parser`` (and its plugin) as
        its ``reasoning_parser`` (``reasoning_parser_plugin``).

        Raises:
            ValueError: Invalid JSON or keys, an unknown backend or reasoning parser (the
                message lists the available ones), or a reasoning parser given twice,
                differently.
        """
        from forkless.plugins import load_general_plugins
        from forkless.structured_output.registry import check_backend

        so = StructuredOutputsConfig.from_json(self.structured_outputs_config)
        load_general_plugins()
        check_backend(so.backend)
        for key, flag in (("reasoning_parser", "--reasoning-parser"),
                          ("reasoning_parser_plugin", "--reasoning-parser-plugin")):
            value = getattr(self, key) or ""
            if value and getattr(so, key) and getattr(so, key) != value:
                raise ValueError(f"{flag} {value!r} and --structured-outputs-config's {key} "
                                 f"{getattr(so, key)!r} disagree: give one")
            if value:
                so = dataclasses.replace(so, **{key: value})
        if so.reasoning_parser:
            from forkless.reasoning import ReasoningParserManager

            try:  # an unknown name fails here
                ReasoningParserManager.resolve(so.reasoning_parser, so.reasoning_parser_plugin)
            except KeyError as exc:  # RegistryError: its message lists the registered parsers
                raise ValueError(f"--reasoning-parser: {exc.args[0] if exc.args else exc}") from None
        return so

    def _reasoning_config(self) -> ReasoningConfig | None:
        """``--reasoning-config`` parsed, with ``--reasoning-parser`` as its
        ``reasoning_parser`` (vLLM's rule: the parser's markers are the defaults of the
        config's); ``None`` with neither. The markers become token ids where the tokenizer
        is (the front end's ``Processor``).

        Raises:
            ValueError: Invalid JSON or keys, an unknown reasoning parser (the message
                lists the registered ones), or a reasoning parser given twice, differently.
        """
        rc = ReasoningConfig.from_json(self.reasoning_config)
        parser = self.reasoning_parser or ""
        if rc is None:
            return ReasoningConfig(reasoning_parser=parser) if parser else None
        if parser and rc.reasoning_parser and rc.reasoning_parser != parser:
            raise ValueError(f"--reasoning-parser {parser!r} and --reasoning-config's reasoning_parser "
                             f"{rc.reasoning_parser!r} disagree: give one")
        if parser:
            rc = dataclasses.replace(rc, reasoning_parser=parser)
        elif rc.reasoning_parser:
            from forkless.plugins import load_general_plugins
            from forkless.reasoning import ReasoningParserManager

            load_general_plugins()
            try:  # an unknown name fails here (--reasoning-parser's is checked with structured outputs')
                ReasoningParserManager.resolve(rc.reasoning_parser, self.reasoning_parser_plugin)
            except KeyError as exc:  # RegistryError: its message lists the registered parsers
                raise ValueError(f"--reasoning-config: {exc.args[0] if exc.args else exc}") from None
        return rc

    def _kv_transfer_config(self, pooling: bool) -> KVTransferConfig | None:
        """``--kv-transfer-config`` parsed and its connector resolved (after the general
        plugins, which may register it); ``None`` without it.

        Raises:
            ValueError: Invalid JSON or keys, an unknown connector (the message lists the
                registered ones), or a combination not supported yet.
        """
        ktc = KVTransferConfig.from_json(self.kv_transfer_config)
        if ktc is None:
            return None
        if pooling:
            raise ValueError("--kv-transfer-config applies to generation, not to --runner pooling (a pooled "
                             "prompt's KV is not kept)")
        if self.async_scheduling:
            raise ValueError("--kv-transfer-config does not work with --async-scheduling yet: a failed load must "
                             "be undone before the next step is planned; leave one of them out")
        from forkless.kv_transfer.registry import KVConnectorFactory
        from forkless.plugins import load_general_plugins

        load_general_plugins()
        # An unknown connector, or settings it refuses, fail here, not in an engine process.
        KVConnectorFactory.get_connector_class(ktc).check_config(ktc)
        return ktc

    def _speculative_config(self, model_path: Path) -> SpeculativeConfig | None:
        """``--speculative-config`` parsed and checked against the other flags and, for a
        draft model, against the target in ``model_path``; ``None`` without it.

        Raises:
            ValueError: Invalid JSON or keys, an unknown ``method`` (the message lists the
                registered ones), a draft model of another vocabulary, or a combination not
                supported yet.
        """
        if self.speculative_config is None:
            return None
        spec = SpeculativeConfig.from_json(self.speculative_config)
        if self.logits_processors:
            raise ValueError("--speculative-config does not work with --logits-processors yet: verification "
                             "keeps the model's own distribution, which a custom processor changes")
        from forkless.plugins import PluginImportError, RegistryError, load_general_plugins
        from forkless.spec_decode.registry import ProposerRegistry

        load_general_plugins()  # once per process: a plugin may register the method
        try:
            ProposerRegistry.resolve(spec.method)  # an unknown method fails here, not in a worker
        except RegistryError as exc:
            raise ValueError(f"--speculative-config: {exc.args[0]}") from None
        except (PluginImportError, TypeError) as exc:  # a class path that does not import, or no proposer
            raise type(exc)(f"--speculative-config: {exc}") from None
        if spec.method == "draft_model":
            from forkless.model_loader.default_model import ModelNotFoundError, resolve_model_path
            from forkless.spec_decode.config import check_draft_model

            # Found like the target: a folder, a GGUF file (converted once), the default
            # model's name; the workers get the folder.
            try:
                draft = resolve_model_path(spec.model)
            except ModelNotFoundError as exc:
                raise ValueError(f"speculative config: the draft 'model': {exc}") from None
            spec = dataclasses.replace(spec, model=str(check_draft_model(model_path, draft)))
        return spec

    def check_class_paths(self) -> None:
        """Import the classes ``--scheduler-cls`` and ``--logits-processors`` name, and check
        each against its interface.

        :meth:`create_engine_config` calls it before resolving the model, and the CLI right
        after parsing the flags, so that a typo fails at once in the process that parsed
        them, not in a worker after the model has loaded. General plugins are loaded first
        (once per process): a plugin may register what a value names. The third class-path
        flag, ``--distributed-executor-backend``, is resolved by
        ``forkless.executor.get_executor_cls``, which sits above this module; the CLI,
        ``LLMEngine`` and ``AsyncLLM`` call it before starting any process.

        Raises:
            ValueError: A value is not a well-formed class path.
            ImportError: A path does not import; the message names the flag, the value,
                the cause and what was expected.
            TypeError: A value is not a subclass of its flag's interface.
            forkless.plugins.PluginLoadError: A general plugin failed under
                ``FORKLESS_PLUGINS_STRICT=1``.
        """
        from forkless.core.sched.interface import SchedulerInterface
        from forkless.core.sched.registry import get_scheduler_cls
        from forkless.logits_processors.interface import LogitsProcessor
        from forkless.logits_processors.registry import load_custom_classes
        from forkless.plugins import PluginImportError, load_general_plugins

        load_general_plugins()
        checks: list[tuple[Any, Any, type]] = [
            (self.logits_processors, lambda v: load_custom_classes(v, entry_points=False), LogitsProcessor)]
        if self.scheduler_cls is not None:  # None is the built-in scheduler: nothing to check
            checks.append((self.scheduler_cls, get_scheduler_cls, SchedulerInterface))
        for value, resolve, interface in checks:
            try:
                resolve(value)
            except PluginImportError as exc:
                # The message already names the flag, the value and the cause.
                raise PluginImportError(
                    f"{exc}; expected a subclass of {interface.__module__}.{interface.__qualname__} "
                    "given as pkg.mod:Class") from exc

    def _validate_flags(self) -> None:
        for name, (accepted, why) in VLLM_ONLY_DEFAULTS.items():
            value = getattr(self, name)
            if value not in accepted:
                raise _bad_flag("--" + name.replace("_", "-"), value, why)
        if self.kv_cache_memory_bytes is not None:
            if self.kv_cache_memory is not None and self.kv_cache_memory != self.kv_cache_memory_bytes:
                raise ValueError(f"--kv-cache-memory {self.kv_cache_memory} and --kv-cache-memory-bytes "
                                 f"{self.kv_cache_memory_bytes} disagree: give one")
            self.kv_cache_memory = self.kv_cache_memory_bytes
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        for name in NONE_MEANS_DEFAULT:
            if getattr(self, name) is None:
                setattr(self, name, defaults[name])
        if type(self.dtype).__module__ == "torch":  # vLLM takes a torch.dtype too (torch.bfloat16)
            self.dtype = str(self.dtype).removeprefix("torch.")
        self.dtype = DTYPE_ALIASES.get(self.dtype, self.dtype)
        if self.max_model_len == -1:  # vLLM's "as long as it can be"
            self.max_model_len = None
        if isinstance(self.max_logprobs, bool) or not isinstance(self.max_logprobs, int) or self.max_logprobs < -1:
            raise _bad_flag("--max-logprobs", self.max_logprobs, "an integer >= 0, or -1 for the whole vocabulary")
        if self.dtype not in DTYPE_CHOICES:
            raise _bad_flag("--dtype", self.dtype, f"one of {', '.join(DTYPE_CHOICES)}")
        if self.load_format not in LOAD_FORMAT_CHOICES:
            raise _bad_flag("--load-format", self.load_format, f"one of {', '.join(LOAD_FORMAT_CHOICES)}")
        if self.quantization is not None and self.quantization not in QUANTIZATION_CHOICES:
            raise _bad_flag("--quantization", self.quantization, f"one of {', '.join(QUANTIZATION_CHOICES)}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPE_CHOICES:
            raise _bad_flag("--kv-cache-dtype", self.kv_cache_dtype, f"one of {', '.join(KV_CACHE_DTYPE_CHOICES)}")
        if self.scheduling_policy not in SCHEDULING_POLICIES:
            raise _bad_flag("--scheduling-policy", self.scheduling_policy,
                            f"one of {', '.join(SCHEDULING_POLICIES)}")
        if self.prefix_caching_hash_algo not in HASH_ALGOS:
            raise _bad_flag("--prefix-caching-hash-algo", self.prefix_caching_hash_algo,
                            f"one of {', '.join(HASH_ALGOS)}")
        threshold = self.long_prefill_token_threshold
        if threshold is not None and (isinstance(threshold, bool) or not isinstance(threshold, int)
                                      or threshold < 0):
            raise _bad_flag("--long-prefill-token-threshold", threshold, "an integer >= 0")
        min_prompt = self.long_prefill_min_prompt_tokens
        if min_prompt is not None and (isinstance(min_prompt, bool) or not isinstance(min_prompt, int)
                                       or min_prompt < 0):
            raise _bad_flag("--long-prefill-min-prompt-tokens", min_prompt, "an integer >= 0")
        share = self.long_prefill_time_share
        if share is not None and (isinstance(share, bool) or not isinstance(share, (int, float))
                                  or not 0.0 <= share < 1.0):
            raise _bad_flag("--long-prefill-time-share", share, "a fraction in [0, 1)")
        per_request = self.max_running_seqs_per_request
        if per_request is not None and (isinstance(per_request, bool) or not isinstance(per_request, int)
                                        or per_request < 0):
            raise _bad_flag("--max-running-seqs-per-request", per_request, "an integer >= 0 (0: no limit)")
        per_client = self.max_prefill_tokens_per_client
        if per_client is not None and (isinstance(per_client, bool) or not isinstance(per_client, int)
                                       or per_client < 0):
            raise _bad_flag("--max-prefill-tokens-per-client", per_client, "an integer >= 0 (0: no limit)")
        for flag, value in (("--block-size", self.block_size), ("--max-num-seqs", self.max_num_seqs),
                            ("--max-model-len", self.max_model_len),
                            ("--max-num-batched-tokens", self.max_num_batched_tokens),
                            ("--kv-cache-memory", self.kv_cache_memory),
                            ("--max-num-partial-prefills", self.max_num_partial_prefills),
                            ("--max-long-partial-prefills", self.max_long_partial_prefills),
                            ("--num-threads", self.num_threads),
                            ("--tensor-parallel-size", self.tensor_parallel_size),
                            ("--pipeline-parallel-size", self.pipeline_parallel_size),
                            ("--max-loras", self.max_loras), ("--max-lora-rank", self.max_lora_rank),
                            ("--max-cpu-loras", self.max_cpu_loras)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise _bad_flag(flag, value, "a positive integer")
        lora_flags = ["--" + name.replace("_", "-") for name in ("max_loras", "max_lora_rank", "max_cpu_loras")
                      if getattr(self, name) != defaults[name]]
        if lora_flags and not self.enable_lora:
            verb = "needs" if len(lora_flags) == 1 else "need"
            raise ValueError(f"{', '.join(lora_flags)} {verb} --enable-lora (they size the LoRA adapters' slots, "
                             "which only exist with it)")
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise _bad_flag("--max-cpu-loras", self.max_cpu_loras,
                            f"at least --max-loras ({self.max_loras}): adapters in slots stay loaded")
        util = self.gpu_memory_utilization
        if isinstance(util, bool) or not isinstance(util, (int, float)) or not 0.0 < util <= 1.0:
            raise _bad_flag("--gpu-memory-utilization", util, "a fraction in (0, 1]")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise _bad_flag("--seed", self.seed, "an integer")
        if not self.distributed_executor_backend:
            raise _bad_flag("--distributed-executor-backend", self.distributed_executor_backend,
                            "uni, mp, ray, or an Executor class path")
        if not isinstance(self.worker_cls, str) or not self.worker_cls.strip():
            raise ValueError(f"worker_cls={self.worker_cls!r} is invalid: expected a Worker subclass path "
                             "('pkg.module.Class') or 'auto'")
        if not isinstance(self.worker_extension_cls, str):
            raise ValueError(f"worker_extension_cls={self.worker_extension_cls!r} is invalid: expected a class "
                             "path ('pkg.module.Class') or '' (none)")
        if not isinstance(self.enable_sleep_mode, bool):
            raise ValueError(f"enable_sleep_mode={self.enable_sleep_mode!r} is invalid: expected True or False")
        self.profiler_options()

    def profiler_options(self) -> tuple[str, dict[str, bool]] | None:
        """``profiler_config`` checked: the trace directory and ``torch.profiler.profile``'s
        flags, or ``None`` without a profiler.

        Raises:
            ValueError: Not a dict, a profiler other than ``torch``, no
                ``torch_profiler_dir``, an unknown key or a flag that is not a bool.
        """
        config = self.profiler_config
        if config is None:
            return None
        if not isinstance(config, dict):
            raise ValueError(f"profiler_config={config!r} is invalid: expected a dict such as "
                             "{'profiler': 'torch', 'torch_profiler_dir': './traces'}")
        unknown = sorted(set(config) - {"profiler", "torch_profiler_dir", *PROFILER_FLAGS})
        if unknown:
            raise ValueError(f"profiler_config keys {unknown} are not supported: forkless takes profiler, "
                             f"torch_profiler_dir and {', '.join(PROFILER_FLAGS)}")
        if config.get("profiler", "torch") != "torch":
            raise ValueError(f"profiler_config profiler={config['profiler']!r} is not supported: expected "
                             "'torch' (run nsys around the process for CUDA's own profiler)")
        trace_dir = config.get("torch_profiler_dir")
        if not isinstance(trace_dir, str) or not trace_dir:
            raise ValueError(f"profiler_config torch_profiler_dir={trace_dir!r} is invalid: expected the "
                             "directory the traces are written to")
        flags = {}
        for key, torch_name in PROFILER_FLAGS.items():
            value = config.get(key, False)
            if not isinstance(value, bool):
                raise ValueError(f"profiler_config {key}={value!r} is invalid: expected True or False")
            flags[torch_name] = value
        return trace_dir, flags


# ------------------------------------------------------------------------- helpers

#: ``profiler_config``'s flags (vLLM's names) and the ``torch.profiler.profile`` argument
#: each sets.
PROFILER_FLAGS = {"torch_profiler_record_shapes": "record_shapes", "torch_profiler_with_memory": "profile_memory",
                  "torch_profiler_with_stack": "with_stack", "torch_profiler_with_flops": "with_flops"}



def _read_json(path: Path) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return {}
    except ValueError as exc:  # (UnicodeDecodeError is one too)
        raise ValueError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object, not {type(data).__name__}")
    return data


def _text_config(hf: dict[str, Any]) -> dict[str, Any]:
    # Multimodal configs nest the language model's fields.
    nested = hf.get("text_config")
    return nested if isinstance(nested, dict) else {}


def _check_architecture(hf: dict[str, Any]) -> str:
    from forkless.models.registry import ModelRegistry, UnsupportedArchitectureError

    archs = hf.get("architectures") or []
    for arch in archs:
        if ModelRegistry.is_registered(arch):
            return arch
    # With no registered name, resolve_model_cls imports nothing and raises the canonical
    # message (supported architectures + how to add one with a plugin).
    ModelRegistry.resolve_model_cls(archs)
    raise UnsupportedArchitectureError(f"model architecture(s) {archs} not supported")


def _model_limit(hf: dict[str, Any]) -> int | None:
    """The model's ``max_position_embeddings`` (or its text config's), if it has one."""
    return hf.get("max_position_embeddings") or _text_config(hf).get("max_position_embeddings")


def _resolve_max_model_len(requested: int | None, hf: dict[str, Any], device_type: str) -> int:
    limit = hf.get("max_position_embeddings") or _text_config(hf).get("max_position_embeddings")
    if requested is not None:
        if limit and requested > limit:
            raise _bad_flag("--max-model-len", requested,
                            f"at most the model's max_position_embeddings ({limit})")
        return requested
    if not limit:
        raise ValueError("the model's config.json has no max_position_embeddings: pass --max-model-len")
    if device_type == "cpu" and limit > CPU_DEFAULT_MAX_MODEL_LEN_CAP:
        logger.info("max_model_len defaults to %d on CPU (the model allows %d; pass --max-model-len "
                    "to change it)", CPU_DEFAULT_MAX_MODEL_LEN_CAP, limit)
        return CPU_DEFAULT_MAX_MODEL_LEN_CAP
    return int(limit)


def _resolve_dtype_name(dtype: str, hf: dict[str, Any], device_type: str, pooling: bool = False) -> str:
    """``--dtype`` resolved: ``auto`` is float32 on the CPU, except that a pooling model runs
    in bfloat16 where the CPU computes it natively (AVX512-BF16 or AMX-BF16). vLLM's ``auto``
    downcasts float32 pooling checkpoints to 16 bits too (float16 on every CPU); bfloat16
    is what forkless's CPU kernels and oneDNN run at speed, and elsewhere float32 stays
    (emulated 16-bit arithmetic is slower than float32). Generative models keep float32 on
    the CPU: their greedy outputs then equal transformers' in float32."""
    if dtype != "auto":
        return dtype
    if device_type == "cpu":
        from forkless.cpu_kernels import cpu_flags

        if pooling and cpu_flags() & {"avx512_bf16", "amx_bf16"}:
            logger.info("--dtype auto: bfloat16 for this pooling model (the CPU has AVX512-BF16 / AMX, as vLLM "
                        "downcasts float32 pooling models); --dtype float32 keeps float32")
            return "bfloat16"
        return "float32"
    name = str(hf.get("dtype") or hf.get("torch_dtype") or "float32").removeprefix("torch.")
    return name if name in DTYPE_CHOICES else "float32"


# generation_config.json's keys that become requests' sampling defaults (vLLM's list), and
# the SamplingParams field each sets.
SAMPLING_DEFAULT_KEYS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
                         "repetition_penalty": "repetition_penalty", "max_new_tokens": "max_tokens"}


def _generation_config(model_path: Path) -> dict[str, Any]:
    data = _read_json(model_path / "generation_config.json")
    # Only plain scalar / list values: the config crosses processes as msgpack.
    return {k: v for k, v in data.items() if isinstance(v, (int, float, str, bool, list)) and v is not None}


def _primary_eos(generation_config: dict[str, Any], hf: dict[str, Any]) -> int | None:
    for source in (generation_config.get("eos_token_id"), hf.get("eos_token_id")):
        if isinstance(source, list):
            source = source[0] if source else None
        if isinstance(source, int):
            return source
    return None


def parse_human_int(value: str, what: str = "a positive integer") -> int:
    """A positive integer flag as vLLM's ``human_readable_int`` reads it: plain, or with a
    suffix (k/m/g/t: powers of 1,000, a decimal before it allowed, as in 25.6k; K/M/G/T:
    of 1,024, whole numbers only).

    Raises:
        argparse.ArgumentTypeError: Anything else, naming ``what`` was expected (argparse
            names the flag).
    """
    text = value.strip()
    suffix = text[-1:]
    decimal = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}.get(suffix)
    binary = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(suffix)
    number = text[:-1] if decimal or binary else text
    try:
        result = float(number) * decimal if decimal else int(number) * (binary or 1)
    except ValueError:
        result = None
    if result is None or result != int(result) or result < 1:
        hint = f" (decimals only before k/m/g/t: {number}{suffix.lower()}?)" if binary and result is None else ""
        raise argparse.ArgumentTypeError(f"expected {what} (4096, 4k, 4K, 25.6k), got {value!r}{hint}")
    return int(result)


def parse_model_len(value: str) -> int | None:
    """``--max-model-len``: :func:`parse_human_int`, or -1 / ``auto``: ``None`` (the model's
    context length).

    Raises:
        argparse.ArgumentTypeError: Anything else (argparse names the flag).
    """
    if value.strip().lower() in ("-1", "auto"):
        return None
    return parse_human_int(value, "a positive number of tokens or -1")


def _served_names(value: str | list[str] | None) -> list[str]:
    names = [value] if isinstance(value, str) else list(value or [])
    if any(not isinstance(n, str) or not n for n in names):
        raise _bad_flag("--served-model-name", value, "non-empty names")
    return list(dict.fromkeys(names))


def _default_served_name(model: str | None, model_path: Path) -> str:
    if model is None:
        from forkless.model_loader.default_model import DEFAULT_MODEL_NAME

        return DEFAULT_MODEL_NAME
    return str(model)


def _as_path(value: Any) -> Any:
    # Classes travel to other processes as paths (the config crosses them as msgpack).
    return f"{value.__module__}:{value.__qualname__}" if isinstance(value, type) else value


def _split_paths(value: str | type | list[str | type] | None) -> list[str]:
    if value is None:
        return []
    items = [value] if isinstance(value, (str, type)) else list(value)
    out: list[str] = []
    for item in items:
        if isinstance(item, type):
            out.append(_as_path(item))
        elif isinstance(item, str):
            out.extend(p.strip() for p in item.split(",") if p.strip())
        else:
            raise _bad_flag("--logits-processors", item, "class paths pkg.mod:Class")
    return out


@dataclass
class AsyncEngineArgs(EngineArgs):
    """Engine arguments for the server (``forkless serve``, as vLLM's ``AsyncEngineArgs``).

    The same fields as :class:`EngineArgs`; only defaults differ, on CPU: a long prompt's
    prefill (one of more than ``CPU_DEFAULT_LONG_PREFILL_MIN_PROMPT_TOKENS`` tokens) is
    capped per step (``CPU_DEFAULT_LONG_PREFILL_TOKEN_THRESHOLD``) and in time
    (``CPU_DEFAULT_LONG_PREFILL_TIME_SHARE``), so that a short request from another client
    is admitted in the next step instead of waiting for the whole prefill; and one request
    runs at most ``CPU_DEFAULT_MAX_RUNNING_SEQS_PER_REQUEST`` sequences at once, and one
    client's prompts ``CPU_DEFAULT_MAX_PREFILL_TOKENS_PER_CLIENT`` tokens a step on average
    while other clients have requests in the engine.
    """

    cpu_long_prefill_token_threshold: ClassVar[int] = CPU_DEFAULT_LONG_PREFILL_TOKEN_THRESHOLD
    cpu_long_prefill_min_prompt_tokens: ClassVar[int] = CPU_DEFAULT_LONG_PREFILL_MIN_PROMPT_TOKENS
    cpu_long_prefill_time_share: ClassVar[float] = CPU_DEFAULT_LONG_PREFILL_TIME_SHARE
    cpu_max_running_seqs_per_request: ClassVar[int] = CPU_DEFAULT_MAX_RUNNING_SEQS_PER_REQUEST
    cpu_max_prefill_tokens_per_client: ClassVar[int] = CPU_DEFAULT_MAX_PREFILL_TOKENS_PER_CLIENT

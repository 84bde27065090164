"""Every environment variable forkless reads, in one place.

Invariants:
    * No other forkless module reads a ``FORKLESS_*`` variable from ``os.environ``; they
      read it here (``tests/test_layering.py`` checks it).
    * Values are read lazily, on each attribute access, so that a test (or a parent process
      that spawns a child) can change ``os.environ`` and be seen immediately.
    * Only the standard library is imported: every process, the API server included,
      imports this module first.
    * Booleans have one spelling rule (:func:`parse_bool`); a value it does not know is an
      error naming the variable, never a silent default.

Usage::

    from forkless import envs
    root = envs.FORKLESS_CACHE_ROOT

To add a variable, add one entry to :data:`environment_variables` and its type to the
``TYPE_CHECKING`` block.
"""

import os
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    FORKLESS_CACHE_ROOT: str
    FORKLESS_FUSED_KERNELS: bool
    FORKLESS_CUSTOM_OPS: str
    FORKLESS_CPU_KERNELS: bool
    FORKLESS_CPU_DECODE_STACK: bool
    FORKLESS_CPU_BF16_LINEAR: str
    FORKLESS_GGUF_ACTIVATIONS: str
    FORKLESS_CUDA_GEMV: bool
    FORKLESS_CUDA_SAMPLER: bool
    FORKLESS_CUDA_PDL: bool
    FORKLESS_KERNEL_CACHE_DIR: str
    FORKLESS_CPU_ISA: str
    FORKLESS_PLUGINS: str | None
    FORKLESS_PLUGINS_STRICT: bool
    FORKLESS_PLUGIN_CACHE: bool
    FORKLESS_ALLOW_DEPRECATED: str
    FORKLESS_PLATFORM: str
    FORKLESS_LOGGING_LEVEL: str
    FORKLESS_CONFIGURE_LOGGING: bool
    FORKLESS_LOG_STATS_INTERVAL: float
    FORKLESS_WORKER_THREADS: int | None
    FORKLESS_GRAMMAR_PROCESS: bool | None
    FORKLESS_GRAMMAR_PROCESSES: int
    FORKLESS_GRAMMAR_ROUTE_TOKENS: bool
    FORKLESS_STEP_TRACE_DIR: str | None
    FORKLESS_API_KEY: str | None
    FORKLESS_HTTP_TIMEOUT_KEEP_ALIVE: int
    FORKLESS_RESPONSES_STORE_SIZE: int
    FORKLESS_ALLOW_RUNTIME_LORA_UPDATING: bool
    FORKLESS_SERVER_DEV_MODE: bool
    FORKLESS_LORA_RESOLVER_CACHE_DIR: str | None
    FORKLESS_TOOL_PARSE_REGEX_TIMEOUT_SECONDS: int
    FORKLESS_RAY_PLACEMENT_STRATEGY: str
    FORKLESS_RAY_PLACEMENT_TIMEOUT: float

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def parse_bool(name: str, default: bool) -> bool:
    """Read a boolean variable: ``1/true/yes/on`` or ``0/false/no/off`` (any case).

    Args:
        name: The variable.
        default: The value when it is unset or empty.

    Raises:
        ValueError: Any other value, naming the variable and the accepted spellings.
    """
    raw = os.environ.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise ValueError(f"{name}={os.environ[name]!r} is not a boolean; expected one of "
                     f"{', '.join(_TRUE + _FALSE)}")


def _number(name: str, default: str, kind: Callable[[str], Any]) -> Any:
    raw = os.environ.get(name, "").strip() or default
    try:
        return kind(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a valid {kind.__name__}") from None


def _positive(name: str, default: str) -> int:
    value = _number(name, default, int)
    if value < 1:
        raise ValueError(f"{name}={value} must be at least 1")
    return value


def usable_cores() -> int:
    """The cores this process may run on (its affinity; the CPU count where there is none),
    from which the per-host defaults here and the workers' thread counts are derived."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _default_grammar_processes() -> int:
    return min(4, max(1, usable_cores() // 4))


def _path(raw: str) -> str:
    return os.path.abspath(os.path.expanduser(raw))


def _cache_root() -> str:
    # Follow the XDG base-directory convention, as huggingface_hub and pip do, so that users
    # who moved their caches off a small home partition get forkless's cache moved too.
    explicit = os.environ.get("FORKLESS_CACHE_ROOT")
    if explicit:
        return _path(explicit)
    return _path(os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache"),
                              "forkless"))


environment_variables: dict[str, Callable[[], Any]] = {
    # Root of every file forkless caches (converted GGUF models, compiled kernels, the
    # entry-point scan). Default: ``$XDG_CACHE_HOME/forkless``, or ``~/.cache/forkless``.
    "FORKLESS_CACHE_ROOT": _cache_root,
    # The custom ops (forkless.ops: RMSNorm, rotary embeddings, SiLU-and-mul) run their
    # device implementation: Triton on CUDA, the C kernels of FORKLESS_CPU_KERNELS on the
    # CPU, a platform plugin's own. ``0`` makes every op built afterwards run its plain
    # PyTorch ``forward_native`` instead (to compare or to debug); read when an op is built.
    "FORKLESS_FUSED_KERNELS": lambda: parse_bool("FORKLESS_FUSED_KERNELS", True),
    # Which custom ops run their device implementation, per op (vLLM's ``custom_ops``):
    # comma-separated ``all``, ``none``, ``+op`` (on), ``-op`` (off), e.g. ``-rms_norm`` or
    # ``none,+silu_and_mul``; the default is FORKLESS_FUSED_KERNELS's. Raw text;
    # forkless.ops parses and checks it when an op is built.
    "FORKLESS_CUSTOM_OPS": lambda: os.environ.get("FORKLESS_CUSTOM_OPS", ""),
    # On CPU (float32), decode attention, the linear layers and the fused layer ops run C
    # kernels compiled once with the system C compiler (``$CC`` or ``cc``) into
    # FORKLESS_KERNEL_CACHE_DIR. ``0`` runs plain torch ops instead (to compare or to debug).
    "FORKLESS_CPU_KERNELS": lambda: parse_bool("FORKLESS_CPU_KERNELS", True),
    # With those kernels, a float32 Llama-family model's decode steps run all its decoder
    # layers in one C call (forkless.models.layers.cpu_decode_stack; the same kernels, the
    # same results, without the Python between them). ``0`` runs the layers one module at
    # a time (to compare or to debug); read when the model is loaded.
    "FORKLESS_CPU_DECODE_STACK": lambda: parse_bool("FORKLESS_CPU_DECODE_STACK", True),
    # What runs a bfloat16 model's linear layers on the CPU: ``auto`` (forkless's C kernel
    # where the CPU has AVX512-BF16 and no AMX, oneDNN elsewhere), ``kernels`` or ``onednn``
    # (to compare or to debug). Lower-cased raw text; forkless.models.layers.cpu_linear
    # checks it (bf16_linear_kind) when a bfloat16 model is packed.
    "FORKLESS_CPU_BF16_LINEAR": lambda: (os.environ.get("FORKLESS_CPU_BF16_LINEAR") or "auto").strip().lower(),
    # How ``--quantization gguf``'s Q8_0 / Q4_1 kernels take their activations: ``int8``
    # (each block of 32 rounded to int8 with its own scale, integer dot products, as
    # llama.cpp does), ``float32`` (exactly the dequantized model's products) or ``auto``
    # (int8 on AVX2 and on AMD's AVX-512, float32 elsewhere: gguf_linear.auto_activations).
    # Lower-cased raw text; forkless.models.layers.gguf_linear checks it.
    "FORKLESS_GGUF_ACTIVATIONS": lambda: (os.environ.get("FORKLESS_GGUF_ACTIVATIONS") or "auto").strip().lower(),
    # On CUDA, half-precision models run one-row linear layers (batch-1 decode) through a
    # Triton GEMV launched with programmatic dependent launch on Hopper
    # (forkless.models.layers.cuda_gemv). ``0`` keeps cuBLAS for every product.
    "FORKLESS_CUDA_GEMV": lambda: parse_bool("FORKLESS_CUDA_GEMV", True),
    # The sampler's Triton kernels on CUDA (forkless.sample.race_triton: the exponential
    # race, top-k and top-p without a sort). ``0`` samples every step with PyTorch ops
    # (to compare or to debug); read at each step.
    "FORKLESS_CUDA_SAMPLER": lambda: parse_bool("FORKLESS_CUDA_SAMPLER", True),
    # On Hopper GPUs, the Triton kernels of decode steps of up to 32 tokens (the GEMV, the
    # fused layer ops, attention) are launched with programmatic dependent launch, each
    # overlapping the end of the one before (forkless.triton_utils.pdl). ``0``: plain launches.
    "FORKLESS_CUDA_PDL": lambda: parse_bool("FORKLESS_CUDA_PDL", True),
    # Where compiled kernels are cached (content-addressed, so one directory can serve
    # every cache root). Default: ``$FORKLESS_CACHE_ROOT/kernels``.
    "FORKLESS_KERNEL_CACHE_DIR": lambda: _path(
        os.environ.get("FORKLESS_KERNEL_CACHE_DIR") or os.path.join(_cache_root(), "kernels")),
    # Which instruction set the CPU kernels are built for: ``auto`` (default: the best this
    # CPU has), or ``avx512``, ``avx2``, ``portable`` to hold them to a lower level (to compare
    # or to debug). Lower-cased raw text; forkless.cpu_kernels checks it against the CPU.
    "FORKLESS_CPU_ISA": lambda: (os.environ.get("FORKLESS_CPU_ISA") or "auto").strip().lower(),
    # Which plugins load: unset = all but endpoint plugins; ``a,b`` = only those; empty =
    # none; ``+a,+b`` = the default set plus these (how endpoint plugins are opted in).
    # Raw text; forkless.plugins parses it.
    "FORKLESS_PLUGINS": lambda: os.environ.get("FORKLESS_PLUGINS"),
    # A plugin that fails to load aborts startup instead of being skipped with a warning.
    "FORKLESS_PLUGINS_STRICT": lambda: parse_bool("FORKLESS_PLUGINS_STRICT", False),
    # Cache the entry-point scan under FORKLESS_CACHE_ROOT (``0`` scans every time).
    "FORKLESS_PLUGIN_CACHE": lambda: parse_bool("FORKLESS_PLUGIN_CACHE", True),
    # Comma-separated deprecated names re-enabled while at deprecation stage 2.
    "FORKLESS_ALLOW_DEPRECATED": lambda: os.environ.get("FORKLESS_ALLOW_DEPRECATED", ""),
    # Forces a platform by name (``cpu``, ``cuda`` or an out-of-tree plugin's).
    "FORKLESS_PLATFORM": lambda: os.environ.get("FORKLESS_PLATFORM", "").strip(),
    # Level of the ``forkless`` logger (DEBUG, INFO, WARNING, ERROR).
    "FORKLESS_LOGGING_LEVEL": lambda: os.environ.get("FORKLESS_LOGGING_LEVEL", "INFO").strip().upper(),
    # ``0`` leaves logging entirely to the application that embeds forkless.
    "FORKLESS_CONFIGURE_LOGGING": lambda: parse_bool("FORKLESS_CONFIGURE_LOGGING", True),
    # Seconds between the logging stat logger's lines.
    "FORKLESS_LOG_STATS_INTERVAL": lambda: _number("FORKLESS_LOG_STATS_INTERVAL", "10", float),
    # torch threads per worker process; 0 = torch's default. Unset: the executor's share
    # (forkless.executor.multiproc.default_worker_threads).
    "FORKLESS_WORKER_THREADS": lambda: (_number("FORKLESS_WORKER_THREADS", "0", int)
                                        if os.environ.get("FORKLESS_WORKER_THREADS", "").strip() else None),
    # Structured outputs: the grammars (compilation, advance, the bitmask's fill) in a
    # process of their own that fills the executor's shared bitmask, instead of threads of
    # the engine core (forkless.structured_output.process). Unset (None): on with the mp
    # executor (the server's), where it measured ahead, off otherwise. Executors without
    # a shared bitmask buffer (Ray) keep them in the engine core whatever this says.
    "FORKLESS_GRAMMAR_PROCESS": lambda: (parse_bool("FORKLESS_GRAMMAR_PROCESS", False)
                                         if os.environ.get("FORKLESS_GRAMMAR_PROCESS", "").strip() else None),
    # How many such processes share the constrained requests (each holds its requests'
    # grammars and fills their rows of the one bitmask; the worker samples once all have).
    # Unset: one per four host cores, 1 to 4 (at batch 256 on a 16-core H200 host, four
    # cut the constrained step's overhead from +32 % to +13 %; benchmarks/README.md).
    "FORKLESS_GRAMMAR_PROCESSES": lambda: _positive("FORKLESS_GRAMMAR_PROCESSES",
                                                    str(_default_grammar_processes())),
    # With grammar processes and an executor that routes tokens (mp): the worker sends a
    # deferred step's sampled tokens straight to the grammar processes, not through the
    # engine core (forkless.structured_output.process). On by default; 0 turns it off.
    "FORKLESS_GRAMMAR_ROUTE_TOKENS": lambda: parse_bool("FORKLESS_GRAMMAR_ROUTE_TOKENS", True),
    # A folder: with --async-scheduling the engine core and each multiprocess worker append
    # one JSON record per step there (host timings; device busy and idle time on CUDA; the
    # grammar process one per deferred bitmask fill), for
    # ``python -m forkless.metrics.step_trace DIR``. Unset: no trace.
    "FORKLESS_STEP_TRACE_DIR": lambda: os.environ.get("FORKLESS_STEP_TRACE_DIR") or None,
    # Default for ``forkless serve --api-key``.
    "FORKLESS_API_KEY": lambda: os.environ.get("FORKLESS_API_KEY") or None,
    # Seconds ``forkless serve`` keeps an idle HTTP connection open between requests
    # (vLLM's VLLM_HTTP_TIMEOUT_KEEP_ALIVE; uvicorn's timeout_keep_alive).
    "FORKLESS_HTTP_TIMEOUT_KEEP_ALIVE": lambda: _number("FORKLESS_HTTP_TIMEOUT_KEEP_ALIVE", "5", int),
    # Responses (/v1/responses with store, OpenAI's default) kept in the API server's memory
    # for previous_response_id and GET, the oldest that has ended dropped first (a background
    # response stays while it runs; a new one finding none ended is a 429); 0 stores none.
    "FORKLESS_RESPONSES_STORE_SIZE": lambda: _number("FORKLESS_RESPONSES_STORE_SIZE", "1000", int),
    # ``1``: ``forkless serve --enable-lora`` adds POST /v1/load_lora_adapter and
    # /v1/unload_lora_adapter, and asks the registered LoRA resolvers for a ``model`` it
    # does not know (vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING).
    "FORKLESS_ALLOW_RUNTIME_LORA_UPDATING": lambda: parse_bool("FORKLESS_ALLOW_RUNTIME_LORA_UPDATING", False),
    # ``1``: ``forkless serve`` adds vLLM's development routes, POST /reset_prefix_cache,
    # /sleep, /wake_up, /pause, /resume and /abort_requests, GET /is_sleeping and /is_paused (vLLM's
    # VLLM_SERVER_DEV_MODE); they change the engine for every client, so only for a
    # server whose clients are trusted.
    "FORKLESS_SERVER_DEV_MODE": lambda: parse_bool("FORKLESS_SERVER_DEV_MODE", False),
    # The built-in filesystem LoRA resolver serves ``<this folder>/<model name>/`` (a PEFT
    # adapter folder); unset: that resolver finds nothing (vLLM's VLLM_LORA_RESOLVER_CACHE_DIR).
    "FORKLESS_LORA_RESOLVER_CACHE_DIR": lambda: _path(os.environ["FORKLESS_LORA_RESOLVER_CACHE_DIR"])
    if os.environ.get("FORKLESS_LORA_RESOLVER_CACHE_DIR") else None,
    # Seconds a tool parser's regular expression may run on one output (vLLM's
    # VLLM_TOOL_PARSE_REGEX_TIMEOUT_SECONDS, read by parsers ported from vLLM; forkless's
    # own parsers scan the text without regular expressions).
    "FORKLESS_TOOL_PARSE_REGEX_TIMEOUT_SECONDS": lambda: _positive("FORKLESS_TOOL_PARSE_REGEX_TIMEOUT_SECONDS", "1"),
    # How ``--distributed-executor-backend ray`` places its one bundle per rank on the Ray
    # cluster: PACK (Ray's and vLLM's default: as few nodes as fit), SPREAD, STRICT_PACK
    # (one node) or STRICT_SPREAD (one rank per node).
    "FORKLESS_RAY_PLACEMENT_STRATEGY": lambda: _choice("FORKLESS_RAY_PLACEMENT_STRATEGY", "PACK",
                                                       ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")),
    # Seconds the Ray executor waits for the cluster to place its bundles before startup
    # fails (an autoscaling cluster may be adding nodes; vLLM waits as long).
    "FORKLESS_RAY_PLACEMENT_TIMEOUT": lambda: _number("FORKLESS_RAY_PLACEMENT_TIMEOUT", "1800", float),
}


def _choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    raw = os.environ.get(name, "").strip().upper() or default
    if raw not in choices:
        raise ValueError(f"{name}={os.environ[name]!r} is not valid; expected one of {', '.join(choices)}")
    return raw


def forwarded_environment(extra: Iterable[str] = ()) -> dict[str, str]:
    """The variables a worker on another machine gets from the engine core (the Ray
    executor's actors do not inherit its environment).

    Args:
        extra: Further names to copy when set (a platform's ``additional_env_vars``).

    Returns:
        Every ``FORKLESS_*`` variable set here (plugins' own included), the Hugging Face
        token, and ``extra``'s.
    """
    names = set(extra) | {"HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"}
    return {k: v for k, v in os.environ.items() if k.startswith("FORKLESS_") or k in names}


def __getattr__(name: str) -> Any:
    getter = environment_variables.get(name)
    if getter is None and name.startswith("VLLM_"):
        # A plugin ported from vLLM by renaming ``vllm`` reads ``envs.VLLM_X``: it gets
        # forkless's own FORKLESS_X (what the environment sets for forkless).
        getter = environment_variables.get("FORKLESS_" + name[len("VLLM_"):])
        if getter is None:
            raise AttributeError(f"module 'forkless.envs' has no attribute {name!r}: forkless reads FORKLESS_* "
                                 f"variables, and FORKLESS_{name[len('VLLM_'):]} is not one of them")
    if getter is None:
        raise AttributeError(f"module 'forkless.envs' has no attribute {name!r}")
    return getter()


def __dir__() -> list[str]:
    return sorted(environment_variables)


def is_set(name: str) -> bool:
    """Whether a known forkless variable is present in the environment.

    Args:
        name: The variable's name, e.g. ``"FORKLESS_CACHE_ROOT"``.

    Returns:
        True when the variable is set, even to the empty string.

    Raises:
        KeyError: When ``name`` is not a variable forkless knows.
    """
    if name not in environment_variables:
        known = sorted(environment_variables)
        raise KeyError(f"unknown forkless environment variable {name!r}; known: {known}")
    return name in os.environ

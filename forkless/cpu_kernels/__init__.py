"""CPU kernels in C: decode attention and prefill attention over cached context, both reading
the paged cache in place, linear layers on packed weights (float32; bfloat16 with
AVX512-BF16) and on GGUF Q8_0 / Q4_1 blocks, and the element-wise layers (RMSNorm, rotary
embeddings, SiLU-and-mul; float32 or bfloat16); and a decode step through a whole stack of
decoder layers on those, float32 or bfloat16 (``decode_stack.c``, called by
:mod:`forkless.models.layers.cpu_decode_stack`).

The sources (``csrc/*.c``) are plain C written once over a vector type that is AVX-512
(16 lanes) or AVX2 + FMA (8 lanes), whichever the compiler targets, with plain loops
otherwise. They are built per instruction-set level (:data:`ISA_FLAGS`), and the level is
chosen at start-up from the CPU's flags (``/proc/cpuinfo``): the best one the CPU has,
unless ``FORKLESS_CPU_ISA`` holds it lower; a level the CPU lacks is refused. The chosen
level and the CPU model are logged once per process and returned by :func:`isa` and
:func:`cpu_model`. Invariants:

* A library runs only on a CPU that has every instruction its level's flags allow: the
  levels are fixed targets (``-march=x86-64-v4`` plus the AVX-512 extensions the CPU
  lists, ``-march=x86-64-v3``, or the compiler's default), never ``-march=native`` alone.
* The cache key holds the sources, the compiler, its flags (so the level) and the CPU's
  flags: another level or another CPU is another file.
* The library loaded reports the level it was compiled for
  (``forkless_cpu_kernels_isa``); a mismatch is refused.

They need no Python or torch headers, so they build in a few seconds with the system C
compiler (``$CC``, else ``cc``) the first time a CPU worker needs them, and are called
through ctypes, which releases the GIL for the call. Built by gcc they run on torch's
OpenMP threads (``torch.set_num_threads``); otherwise on the calling thread. The shared
library is cached in ``$FORKLESS_KERNEL_CACHE_DIR`` (default ``$FORKLESS_CACHE_ROOT/kernels``).

Without a compiler, or with ``FORKLESS_CPU_KERNELS=0``, :func:`load` returns None and
callers use plain torch ops (logged once).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from forkless import envs
from forkless.logger import init_logger

logger = init_logger(__name__)

_CSRC = Path(__file__).with_name("csrc")
_SOURCES = ("paged_decode.c", "paged_prefill.c", "linear.c", "linear_bf16.c", "quant_linear.c", "layers.c",
            "decode_stack.c", "argmax.c")
_ABI_VERSION = 13
_BASE_FLAGS = ("-O3", "-shared", "-fPIC", "-fno-math-errno")

_ptr, _i64, _i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
_SIGNATURES = {
    "forkless_paged_decode_f32": [_ptr, _ptr, _ptr, _ptr, _i64, _ptr, _ptr, _ptr, _ptr, _i32, _i32, _i32, _i32,
                                  _i32, ctypes.c_float],
    "forkless_paged_decode_bf16": [_ptr, _ptr, _ptr, _ptr, _i64, _ptr, _ptr, _ptr, _ptr, _i32, _i32, _i32, _i32,
                                   _i32, ctypes.c_float],
    **{f"forkless_paged_prefill_{t}": [_ptr, _ptr, _ptr, _ptr, _i64, _ptr, _ptr, _ptr, _ptr, _ptr, _i32, _i32, _i32,
                                       _i32, _i32, ctypes.c_float] for t in ("f32", "bf16")},
    "forkless_linear_f32": [_ptr, _i64, _ptr, _ptr, _ptr, _i64, _i32, _i32, _i32],
    **{f"forkless_rms_norm_{t}": [_ptr, _i64, _i64, _ptr, _i64, _ptr, _ptr, _ptr, _i32, _i32, _i32, ctypes.c_float]
       for t in ("f32", "bf16")},
    **{f"forkless_rotary_{t}": [_ptr, _i64, _i64, _ptr, _i64, _i64, _ptr, _ptr, _i64, _i32, _i32, _i32, _i32]
       for t in ("f32", "bf16")},
    **{f"forkless_silu_and_mul_{t}": [_ptr, _i64, _ptr, _i32, _i32] for t in ("f32", "bf16")},
    "forkless_row_argmax_f32": [_ptr, _i64, _ptr, _i32, _i64],
    "forkless_linear_q8_0": [_ptr, _i64, _ptr, _ptr, _ptr, _ptr, _i64, _i32, _i32, _i32],
    "forkless_linear_q4_1": [_ptr, _i64, _ptr, _ptr, _ptr, _ptr, _ptr, _i64, _i32, _i32, _i32],
    "forkless_linear_q8_0_i8": [_ptr, _i64, _ptr, _ptr, _ptr, _ptr, _i64, _i32, _i32, _i32],
    "forkless_linear_q4_1_i8": [_ptr, _i64, _ptr, _ptr, _ptr, _ptr, _ptr, _i64, _i32, _i32, _i32],
    "forkless_linear_bf16": [_ptr, _i64, _ptr, _ptr, _ptr, _i64, _i32, _i32, _i32],
    **{f"forkless_decode_stack_{t}": [_ptr, _ptr, _i32, _ptr, _ptr, _i64, _ptr, _ptr, _i64, _ptr, _ptr, _ptr]
       for t in ("f32", "bf16")},
}

#: The instruction-set levels, best first: the CPU flags each needs (as ``/proc/cpuinfo``
#: names them) and its compiler flags. ``portable`` is the compiler's default target (on
#: x86-64, SSE2): the kernels' plain loops, on any CPU.
ISA_LEVELS = ("avx512", "avx2", "portable")
_ISA_CPU_FLAGS = {
    # x86-64-v4: AVX-512 F, BW, CD, DQ, VL on top of v3.
    "avx512": ("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"),
    # x86-64-v3: AVX, AVX2, BMI1, BMI2, F16C, FMA, LZCNT (abm), MOVBE.
    "avx2": ("avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe"),
    "portable": (),
}
ISA_FLAGS = {
    "avx512": ("-march=x86-64-v4", "-mtune=native", "-mprefer-vector-width=512"),
    "avx2": ("-march=x86-64-v3", "-mtune=native"),
    "portable": (),
}
# AVX-512 extensions added to the avx512 build where the CPU lists them (linear_bf16.c's
# tiles need AVX512-BF16; the compiler may use the others).
_AVX512_EXTENSIONS = {"avx512_bf16": "-mavx512bf16", "avx512_vnni": "-mavx512vnni", "avx512_fp16": "-mavx512fp16"}
# The linear kernel's few-row path (linear.c's few_rows: each weight panel read as several
# streams) only up to 5 rows on AMD's AVX-512 cores, the tile path from 6: on a 2-core Zen 4
# the tile path was faster at every row count from 6 to 32 (all 30 layers and the head of
# the default model: 6 rows 22-24 against 28-43 ms, 12 rows 29-31 against 34-42, 32 rows
# 50-57 against 62-65; benchmarks/cpu_linear_isa.py), where on an Intel Xeon the few-row
# path won up to 32 (linear.c's header).
_AMD_AVX512_TUNING = ("-DSMALL_M=5",)


def _cpuinfo_field(*names: str) -> str | None:
    """The first ``/proc/cpuinfo`` line's value for one of ``names``; None without it."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in names:
                    return value.strip()
    except OSError:
        pass
    return None


def _cpu_signature() -> str:
    """What distinguishes this CPU for code built for it."""
    return _cpuinfo_field("flags", "Features") or platform.processor() or platform.machine()


@functools.lru_cache(maxsize=None)
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as ``/proc/cpuinfo`` lists them (empty where it is absent)."""
    return frozenset((_cpuinfo_field("flags") or "").split())


@functools.lru_cache(maxsize=None)
def cpu_vendor() -> str:
    """The CPU's vendor as ``/proc/cpuinfo`` names it (``GenuineIntel``, ``AuthenticAMD``),
    else an empty string."""
    return _cpuinfo_field("vendor_id") or ""


@functools.lru_cache(maxsize=None)
def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what :mod:`platform` knows."""
    return _cpuinfo_field("model name", "Model", "cpu model") or platform.processor() or platform.machine()


def supported_isas() -> tuple[str, ...]:
    """The levels of :data:`ISA_LEVELS` this CPU can run, best first (``portable`` always)."""
    flags = cpu_flags()
    x86 = platform.machine().lower() in ("x86_64", "amd64")
    have = [level for level in ISA_LEVELS[:-1] if x86 and all(f in flags for f in _ISA_CPU_FLAGS[level])]
    # avx512 builds on v3: a CPU listing AVX-512 without AVX2 is not one to trust with it.
    if "avx512" in have and "avx2" not in have:
        have.remove("avx512")
    return (*have, "portable")


def requested_isa() -> str:
    """The level ``FORKLESS_CPU_ISA`` asks for, resolved against the CPU: ``auto`` is the
    best the CPU has.

    Raises:
        ValueError: The variable names no level, or one this CPU lacks (the message lists
            the CPU's levels and model).
    """
    want = envs.FORKLESS_CPU_ISA
    have = supported_isas()
    if want == "auto":
        return have[0]
    if want not in ISA_LEVELS:
        raise ValueError(f"FORKLESS_CPU_ISA={want!r} is not a level: expected auto or one of "
                         f"{', '.join(ISA_LEVELS)}")
    if want not in have:
        raise ValueError(f"FORKLESS_CPU_ISA={want!r}: this CPU ({cpu_model()}) lacks it; it has "
                         f"{', '.join(have)}")
    return want


def isa_flags(level: str) -> tuple[str, ...]:
    """The compiler flags of ``level`` on this CPU (the avx512 level adds the AVX-512
    extensions the CPU lists, and the tuning of :data:`_AMD_AVX512_TUNING` on AMD CPUs)."""
    flags = ISA_FLAGS[level]
    if level == "avx512":
        flags += tuple(flag for name, flag in _AVX512_EXTENSIONS.items() if name in cpu_flags())
        if cpu_vendor() == "AuthenticAMD":
            flags += _AMD_AVX512_TUNING
    return flags


def _compile(cc: str, flags: tuple[str, ...], out: Path) -> str | None:
    """Build the library into ``out``; the compiler's complaint on failure, else None."""
    out.parent.mkdir(parents=True, exist_ok=True)
    # Build next to the target and rename: processes building at once never load a
    # half-written library.
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        sources = [str(_CSRC / name) for name in _SOURCES]
        proc = subprocess.run([cc, *flags, "-o", tmp, *sources, "-lm"], capture_output=True, text=True)
        if proc.returncode != 0:
            return proc.stderr.strip() or f"{cc} exited with {proc.returncode}"
        os.replace(tmp, out)
        return None
    except OSError as exc:
        return str(exc)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _is_gcc(cc: str) -> bool:
    """Whether ``cc`` is gcc: its ``-fopenmp`` links libgomp, the runtime torch ships."""
    try:
        proc = subprocess.run([cc, "-dM", "-E", "-"], input="", capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return "__GNUC__" in proc.stdout and "__clang__" not in proc.stdout


def _build(level: str) -> Path | None:
    """The library of ``level``, from the cache or compiled; None where it cannot be built."""
    started = time.perf_counter()
    cc = os.environ.get("CC") or "cc"
    source = b"\0".join((_CSRC / name).read_bytes() for name in (*_SOURCES, "common.h"))
    # OpenMP only with gcc: its libgomp has the soname of the one torch loads, so the
    # kernels share torch's threads (clang's libomp would be a second pool competing with
    # them for the cores).
    base = (*_BASE_FLAGS, *isa_flags(level))
    flag_sets = [base]
    if shutil.which(cc) is not None and _is_gcc(cc):
        flag_sets = [(*base, "-fopenmp"), base]
    candidates = []
    for flags in flag_sets:
        key = hashlib.sha256(b"\0".join(
            [source, cc.encode(), level.encode(), " ".join(flags).encode(), _cpu_signature().encode()])).hexdigest()[:16]
        out = Path(envs.FORKLESS_KERNEL_CACHE_DIR) / f"forkless_cpu-{level}-{key}.so"
        if out.exists():
            logger.debug("loaded the %s CPU kernels from the cache in %.2f s: %s", level,
                         time.perf_counter() - started, out)
            return out
        candidates.append((flags, out))
    if shutil.which(cc) is None:
        logger.warning("no C compiler (%r) found: CPU attention and linear layers run on plain torch "
                       "ops, which are slower (install gcc or clang, or set CC)", cc)
        return None
    # The one slow step of a first start on CPU that nothing else would announce.
    logger.info("compiling the %s CPU kernels with %s (first start only, a few seconds)...", level, cc)
    errors = []
    for flags, out in candidates:
        error = _compile(cc, flags, out)
        if error is None:
            logger.info("compiled the CPU kernels in %.1f s: %s", time.perf_counter() - started, out)
            return out
        errors.append(f"{cc} {' '.join(flags)}: {error}")
    logger.warning("could not compile the %s CPU kernels:\n%s", level, "\n".join(errors))
    return None


def _open(level: str, path: Path) -> ctypes.CDLL | None:
    """Load and type the library at ``path``; None (logged) if it is not ``level``'s."""
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as exc:
        logger.warning("could not load the CPU kernels %s (%s)", path, exc)
        return None
    if lib.forkless_cpu_kernels_abi_version() != _ABI_VERSION:
        logger.warning("stale CPU kernels %s", path)
        return None
    lib.forkless_cpu_kernels_isa.restype = ctypes.c_char_p
    lib.forkless_quant_i8_route.restype = ctypes.c_char_p
    built_for = lib.forkless_cpu_kernels_isa().decode()
    if built_for != level:
        # The compiler did not target what the flags asked (e.g. its -march ignored).
        logger.warning("the %s CPU kernels %s hold %s code; not using them", level, path, built_for)
        return None
    for name, argtypes in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes = argtypes
        fn.restype = ctypes.c_int
    lib.isa = level
    return lib


def load_isa(level: str) -> ctypes.CDLL | None:
    """The kernels built for ``level`` (for tests and benchmarks comparing levels; the
    engine calls :func:`load`).

    Returns:
        The library, its functions typed and its level in ``lib.isa``; None where it cannot
        be built or loaded (logged).

    Raises:
        ValueError: ``level`` is not in :data:`ISA_LEVELS`, or this CPU lacks it.
    """
    if level not in ISA_LEVELS:
        raise ValueError(f"unknown CPU ISA level {level!r}: expected one of {', '.join(ISA_LEVELS)}")
    if level not in supported_isas():
        raise ValueError(f"CPU ISA level {level!r}: this CPU ({cpu_model()}) lacks it; it has "
                         f"{', '.join(supported_isas())}")
    return _load_level(level)


@functools.lru_cache(maxsize=None)
def _load_level(level: str) -> ctypes.CDLL | None:
    path = _build(level)
    return None if path is None else _open(level, path)


@functools.lru_cache(maxsize=None)
def load() -> ctypes.CDLL | None:
    """The compiled kernels of the level chosen for this CPU, built on first use; None
    where they are unavailable.

    The level is ``FORKLESS_CPU_ISA``'s (``auto``: the best the CPU has); where its build
    fails the next level down is tried. The choice and the CPU model are logged once.

    Returns:
        The library, its functions typed and its level in ``lib.isa``; None when
        ``FORKLESS_CPU_KERNELS=0``, no C compiler is found, or every build or load fails
        (each logged once).

    Raises:
        ValueError: ``FORKLESS_CPU_ISA`` names no level, or one this CPU lacks.
    """
    if not envs.FORKLESS_CPU_KERNELS:
        return None
    wanted = requested_isa()
    how = "best of this CPU" if envs.FORKLESS_CPU_ISA == "auto" else "FORKLESS_CPU_ISA"
    for level in ISA_LEVELS[ISA_LEVELS.index(wanted):]:
        lib = load_isa(level)
        if lib is not None:
            logger.info("CPU kernels: ISA %s (%s; %s) on %s", level, how,
                        " ".join(isa_flags(level)) or "compiler's default target", cpu_model())
            return lib
        if shutil.which(os.environ.get("CC") or "cc") is None:
            break
    logger.warning("no CPU kernels could be built or loaded; attention and linear layers run on plain "
                   "torch ops, which are slower")
    return None


def isa() -> str | None:
    """The ISA level of the kernels :func:`load` returns (``avx512``, ``avx2`` or
    ``portable``); None where they are unavailable."""
    lib = load()
    return None if lib is None else lib.isa


def check(status: int) -> None:
    """Raise for a kernel's non-zero return (it could not allocate its scratch memory)."""
    if status:
        raise MemoryError("a CPU kernel could not allocate its scratch memory")

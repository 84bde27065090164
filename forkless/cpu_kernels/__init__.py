"""CPU kernels in C: decode attention and prefill attention over cached context, both reading
the paged cache in place, linear layers on packed weights,
and the element-wise layers (RMSNorm, rotary embeddings, SiLU-and-mul).

The sources (``csrc/*.c``) are plain C with AVX2 intrinsics where the compiler targets
them. They need no Python or torch headers, so they build in a few seconds with the
system C compiler (``$CC``, else ``cc``) the first time a CPU worker needs them, and are
called through ctypes, which releases the GIL for the call. Built by gcc they run on
torch's OpenMP threads (``torch.set_num_threads``); otherwise on the calling thread.
The shared library is cached in ``$FORKLESS_KERNEL_CACHE_DIR`` (default
``$FORKLESS_CACHE_ROOT/kernels``), keyed by the sources, the compiler, its flags and the
host CPU (``-march=native`` code must not run on another CPU).

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
_SOURCES = ("paged_decode.c", "paged_prefill.c", "linear.c", "layers.c")
_ABI_VERSION = 6
_BASE_FLAGS = ("-O3", "-shared", "-fPIC", "-fno-math-errno")

_ptr, _i64, _i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
_SIGNATURES = {
    "forkless_paged_decode_f32": [_ptr, _ptr, _ptr, _ptr, _i64, _ptr, _ptr, _ptr, _ptr, _i32, _i32, _i32, _i32,
                                  _i32, ctypes.c_float],
    "forkless_paged_prefill_f32": [_ptr, _ptr, _ptr, _ptr, _i64, _ptr, _ptr, _ptr, _ptr, _ptr, _i32, _i32, _i32,
                                   _i32, _i32, ctypes.c_float],
    "forkless_linear_f32": [_ptr, _i64, _ptr, _ptr, _ptr, _i64, _i32, _i32, _i32],
    "forkless_rms_norm_f32": [_ptr, _i64, _i64, _ptr, _i64, _ptr, _ptr, _ptr, _i32, _i32, _i32, ctypes.c_float],
    "forkless_rotary_f32": [_ptr, _i64, _i64, _ptr, _i64, _i64, _ptr, _ptr, _i64, _i32, _i32, _i32, _i32],
    "forkless_silu_and_mul_f32": [_ptr, _i64, _ptr, _i32, _i32],
}


def _cpu_signature() -> str:
    """What distinguishes this CPU for ``-march=native`` code."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return line
    except OSError:
        pass
    return platform.processor() or platform.machine()


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


def _build() -> Path | None:
    started = time.perf_counter()
    cc = os.environ.get("CC") or "cc"
    source = b"\0".join((_CSRC / name).read_bytes() for name in (*_SOURCES, "common.h"))
    # -march=native where the compiler knows it (gcc, clang on x86), portable code otherwise;
    # OpenMP only with gcc: its libgomp has the soname of the one torch loads, so the
    # kernels share torch's threads (clang's libomp would be a second pool competing with
    # them for the cores).
    flag_sets = [(*_BASE_FLAGS, "-march=native"), _BASE_FLAGS]
    if shutil.which(cc) is not None and _is_gcc(cc):
        flag_sets = [(*flags, "-fopenmp") for flags in flag_sets] + flag_sets
    candidates = []
    for flags in flag_sets:
        key = hashlib.sha256(b"\0".join(
            [source, cc.encode(), " ".join(flags).encode(), _cpu_signature().encode()])).hexdigest()[:16]
        out = Path(envs.FORKLESS_KERNEL_CACHE_DIR) / f"forkless_cpu-{key}.so"
        if out.exists():
            logger.info("loaded the CPU kernels from the cache in %.2f s: %s", time.perf_counter() - started, out)
            return out
        candidates.append((flags, out))
    if shutil.which(cc) is None:
        logger.warning("no C compiler (%r) found: CPU attention and linear layers run on plain torch "
                       "ops, which are slower (install gcc or clang, or set CC)", cc)
        return None
    # The one slow step of a first start on CPU that nothing else would announce.
    logger.info("compiling the CPU kernels with %s (first start only, a few seconds)...", cc)
    errors = []
    for flags, out in candidates:
        error = _compile(cc, flags, out)
        if error is None:
            logger.info("compiled the CPU kernels in %.1f s: %s", time.perf_counter() - started, out)
            return out
        errors.append(f"{cc} {' '.join(flags)}: {error}")
    logger.warning("could not compile the CPU kernels; attention and linear layers run on plain "
                   "torch ops, which are slower:\n%s", "\n".join(errors))
    return None


@functools.lru_cache(maxsize=None)
def load() -> ctypes.CDLL | None:
    """The compiled kernels, built on first use; None where they are unavailable.

    Returns:
        The library, its functions typed; None when ``FORKLESS_CPU_KERNELS=0``, no C
        compiler is found, or the build or load fails (each logged once).
    """
    if not envs.FORKLESS_CPU_KERNELS:
        return None
    path = _build()
    if path is None:
        return None
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as exc:
        logger.warning("could not load the CPU kernels %s (%s); using plain torch ops", path, exc)
        return None
    if lib.forkless_cpu_kernels_abi_version() != _ABI_VERSION:
        logger.warning("stale CPU kernels %s; using plain torch ops", path)
        return None
    for name, argtypes in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes = argtypes
        fn.restype = ctypes.c_int
    return lib


def check(status: int) -> None:
    """Raise for a kernel's non-zero return (it could not allocate its scratch memory)."""
    if status:
        raise MemoryError("a CPU kernel could not allocate its scratch memory")

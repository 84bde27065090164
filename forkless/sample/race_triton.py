"""A batch's rows sampled at their temperatures in one pass over the logits, on the GPU.

The sampler draws a random row's token by an exponential race, ``argmax(p / q)`` with
``p = softmax(logits / T)`` and ``q ~ Exp(1)`` per vocabulary entry. Run as PyTorch ops
that is a float32 copy of the logits, the division by ``T``, a softmax, a tensor of noise,
a division and an argmax: about 3.3 GB of memory traffic a step at 512 rows of a
151,936-token vocabulary, ~1 ms on an H100, for a decode step of ~15 ms. Here each row's
race runs where its logits are read, once: ``argmax(p / q) = argmax(logits / T - log q)``
(the softmax's normaliser is the same for the whole row and ``log`` keeps the order), the
noise drawn in the kernel from Philox counters. A first launch reduces chunks of
``BLOCK`` entries to their winner, a second each row's chunks (``argmax_triton``'s).

Rows with top-k, top-p or min_p race without the sort the PyTorch path runs
(``race_rows_top_k_top_p``: the top-k set listed from a bound that slices' maxima give, or
a radix select of the k-th largest logit where it does not fit the list; min_p as a
threshold below the row's max; then a few passes over the list or the row, rejecting
winners outside the top-p set). Which steps come here is
:meth:`forkless.sample.sampler.Sampler.races_in_one_pass`'s rule: rows that need only
their temperature, top-k, top-p and min_p (no penalties, logprobs, other active logits
processors or per-request seeds). Other CUDA steps come here too, with logits the
sampler's PyTorch ops have already processed and tempered, seeded rows with their own
seeds (``row_seeds``).

Invariants:
    * A random row's token has the distribution of the sampler's PyTorch race on CUDA:
      ``q = -log(1 - u)`` from float32 uniforms ``u`` in [0, 1) (as ``exponential_`` draws
      them), clamped to the smallest normal float32 so that ``log q`` is finite.
    * A greedy row (temperature below ``SAMPLING_EPS``) takes ``torch.argmax``'s index of
      its logits: no noise, the first index of the largest value, the first NaN if any.
      A random row with a NaN logit takes its first NaN too (argmax's rule).
    * One ``seed`` (and ``block``) gives one draw: the noise of an entry depends on them
      and its place alone. Each call takes a new seed from torch's default CPU generator
      (so ``--seed`` fixes the run); a row given its own seed draws from that alone.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from forkless.sample.argmax_triton import BLOCK, _row_argmax_kernel
from forkless.sampling_params import SAMPLING_EPS

#: The largest ``rows * V`` the kernel's 32-bit indices and Philox counters cover.
MAX_ENTRIES = 2**31 - 1
_TINY = torch.finfo(torch.float32).tiny


@triton.jit
def _row_scale(temp_ptr, row, EPS: tl.constexpr):
    """Whether the row is greedy, and what its logits are multiplied by (1 / T; 1 if greedy)."""
    t = tl.load(temp_ptr + row)
    greedy = t < EPS
    return greedy, tl.where(greedy, 1.0, 1.0 / tl.where(greedy, 1.0, t))


@triton.jit
def _load_logits(x_row_ptr, offs, V):
    """Logits at ``offs`` in float32, ``-inf`` past the row's end."""
    return tl.load(x_row_ptr + offs, mask=offs < V, other=float("-inf")).to(tl.float32)


@triton.jit
def _first_max(key, offs, V):
    """The largest of ``key`` and the first of ``offs`` holding it."""
    best = tl.max(key, 0)
    return best, tl.min(tl.where(key == best, offs, V), 0)


@triton.jit
def _later_wins_if_larger(best, idx, later_best, later_idx):
    """The running winner against a block of higher indices: that one wins only with a
    strictly larger key, so a tie keeps the first index."""
    take = later_best > best
    return tl.where(take, later_best, best), tl.where(take, later_idx, idx)


@triton.jit
def _quarter_race(x_row_ptr, offs, u, V, scale, greedy, TINY: tl.constexpr):
    """A quarter of a chunk: its best key, the first index holding it, whether it has a
    NaN logit, and the first one."""
    x = _load_logits(x_row_ptr, offs, V)
    nan = x != x
    q = tl.maximum(-tl.log(1.0 - u), TINY)
    key = tl.where(nan | (offs >= V), float("-inf"), x * scale - tl.where(greedy, 0.0, tl.log(q)))
    best, first_best = _first_max(key, offs, V)
    return best, first_best, tl.max(nan.to(tl.int32), 0), tl.min(tl.where(nan, offs, V), 0)


@triton.jit
def _later_quarter(val, idx, has_nan, first_nan, x_row_ptr, offs, u, V, scale, greedy, TINY: tl.constexpr):
    """Fold the next quarter (higher indices) in."""
    v, i, n, f = _quarter_race(x_row_ptr, offs, u, V, scale, greedy, TINY)
    val, idx = _later_wins_if_larger(val, idx, v, i)
    return val, idx, tl.maximum(has_nan, n), tl.minimum(first_nan, f)


@triton.jit
def _chunk_race_kernel(x_ptr, temp_ptr, val_ptr, idx_ptr, nan_ptr, seed, V, stride_row, NUM_CHUNKS,
                       EPS: tl.constexpr, TINY: tl.constexpr, BLOCK: tl.constexpr):
    # A chunk is four quarters in index order, whose noise comes from one Philox call per
    # four entries (rand4x): generating the noise is most of the kernel's arithmetic.
    QUARTER: tl.constexpr = BLOCK // 4
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    greedy, scale = _row_scale(temp_ptr, row, EPS)
    sub = tl.arange(0, QUARTER)
    u0, u1, u2, u3 = tl.rand4x(seed, (row * NUM_CHUNKS + chunk) * QUARTER + sub)
    x_row = x_ptr + row * stride_row
    base = chunk * BLOCK
    val, idx, has_nan, first_nan = _quarter_race(x_row, base + sub, u0, V, scale, greedy, TINY)
    val, idx, has_nan, first_nan = _later_quarter(val, idx, has_nan, first_nan, x_row, base + QUARTER + sub, u1,
                                                  V, scale, greedy, TINY)
    val, idx, has_nan, first_nan = _later_quarter(val, idx, has_nan, first_nan, x_row, base + 2 * QUARTER + sub,
                                                  u2, V, scale, greedy, TINY)
    val, idx, has_nan, first_nan = _later_quarter(val, idx, has_nan, first_nan, x_row, base + 3 * QUARTER + sub,
                                                  u3, V, scale, greedy, TINY)
    out = row * NUM_CHUNKS + chunk
    tl.store(val_ptr + out, val)
    tl.store(idx_ptr + out, tl.where(has_nan > 0, first_nan, idx).to(tl.int64))
    tl.store(nan_ptr + out, has_nan)


def _seed(caller: str, logits: torch.Tensor, seed: int | None, headroom: int) -> int:
    """``seed``, or one from torch's default CPU generator leaving ``headroom`` below the
    31-bit limit; refuses logits the kernels' 32-bit counters do not cover."""
    rows, v = logits.shape
    if rows * v > MAX_ENTRIES:
        raise ValueError(f"{caller} takes at most {MAX_ENTRIES} logits, got {rows} x {v}")
    return int(torch.randint(MAX_ENTRIES - headroom, (1,)).item()) if seed is None else seed


def race_rows(logits: torch.Tensor, temperature: torch.Tensor, seed: int | None = None,
              block: int = BLOCK) -> torch.Tensor:
    """One token per row: a draw from ``softmax(logits / T)``, or the argmax where ``T`` is
    below ``SAMPLING_EPS``.

    Args:
        logits: ``[rows, V]`` float32, bfloat16 or float16 on a CUDA device (Triton's
            interpreter: the CPU), the last dimension contiguous, ``rows * V`` at most
            :data:`MAX_ENTRIES`. Not modified.
        temperature: ``[rows]`` float32 on the same device.
        seed: The noise's seed; ``None``: drawn from torch's default CPU generator.
        block: Entries per first-launch program (a power of two, at least 4; small ones
            keep the interpreter's tests short).

    Returns:
        ``[rows]`` int64 token ids.
    """
    rows, v = logits.shape
    seed = _seed("race_rows", logits, seed, 0)
    chunks = triton.cdiv(v, block)
    vals = torch.empty(rows * chunks, dtype=torch.float32, device=logits.device)
    idxs = torch.empty(rows * chunks, dtype=torch.int64, device=logits.device)
    nans = torch.empty(rows * chunks, dtype=torch.int32, device=logits.device)
    out = torch.empty(rows, dtype=torch.int64, device=logits.device)
    _chunk_race_kernel[(rows, chunks)](logits, temperature, vals, idxs, nans, seed, v, logits.stride(0), chunks,
                                       EPS=SAMPLING_EPS, TINY=_TINY, BLOCK=block, num_warps=8)
    _row_argmax_kernel[(rows,)](vals, idxs, nans, out, v, chunks,
                                BLOCK_C=max(16, triton.next_power_of_2(chunks)), num_warps=1)
    return out


@triton.jit
def _ordered_key(x):
    """float32 -> int64 in [0, 2**32) of the same order (``-0.0`` just below ``+0.0``)."""
    bits = x.to(tl.int32, bitcast=True)
    return (bits ^ ((bits >> 31) & 0x7FFFFFFF)).to(tl.int64) + 2147483648


@triton.jit
def _key_value(key):
    """The float32 whose ``_ordered_key`` is ``key`` (the xor undoes itself)."""
    bits = (key - 2147483648).to(tl.int32)
    return (bits ^ ((bits >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)


@triton.jit
def _kth_largest(x_row, V, k, BLOCK: tl.constexpr, LOW_BITS: tl.constexpr):
    """A threshold that keeps a row's ``k`` largest logits and their ties (a NaN counts as
    ``-inf``), by radix select: passes of a histogram of the next 8 bits of the
    order-keeping keys, among the entries whose higher bits match those chosen so far.
    The lowest ``LOW_BITS`` of the keys are the same for all entries of one sign (bf16 or
    fp16 logits widened to float32), so no pass reads them: the threshold returned is
    the k-th largest value, or (negative) a float32 just below it that no logit lies
    between; ``-inf`` where fewer than ``k`` logits are finite."""
    sub = tl.arange(0, BLOCK)
    bins = tl.arange(0, 256)
    prefix = k * 0
    left = k  # how many of the entries that match the prefix still rank above the k-th
    for shift in tl.static_range(24, LOW_BITS - 1, -8):
        hist = tl.zeros([256], dtype=tl.int32)
        misses = 0  # entries out of the running, counted into bin 0 (a histogram has no mask)
        for start in range(0, V, BLOCK):
            offs = start + sub
            x = _load_logits(x_row, offs, V)
            key = _ordered_key(tl.where(x != x, float("-inf"), x))
            match = (offs < V) & ((key >> (shift + 8)) == prefix)
            hist += tl.histogram(tl.where(match, (key >> shift) & 255, 0).to(tl.int32), 256)
            misses += BLOCK - tl.sum(match.to(tl.int32), 0)
        counts = tl.where(bins == 0, hist - misses, hist).to(tl.int64)
        at_or_above = tl.sum(counts, 0) - tl.cumsum(counts, 0) + counts
        chosen = tl.max(tl.where(at_or_above >= left, bins, -1), 0).to(tl.int64)
        left -= tl.sum(tl.where(bins > chosen, counts, 0), 0)
        prefix = (prefix << 8) | chosen
    return _threshold(prefix << LOW_BITS)


@triton.jit
def _threshold(key):
    """The float32 of a k-th largest key whose low bits were not chosen (left 0): the value
    itself or, negative, one just below it; ``-inf`` for ``-inf``'s key (0-filled low bits
    turn it into a NaN, which no logit is at or above: fewer than k finite logits would
    leave a row nothing to draw)."""
    value = _key_value(key)
    return tl.where(value != value, float("-inf"), value)


@triton.jit
def _kth_of(vals, k, LOW_BITS: tl.constexpr):
    """The k-th largest of ``vals`` (a list of at most a few thousand, ``k`` at most its
    length), ties counted, as :func:`_kth_largest` gives it (``-inf`` where fewer than
    ``k`` are finite). Built bit by bit from the top: the largest key that at least ``k``
    keys reach, one reduction a bit -- a fixed number, where taking off the largest
    values a tie group at a time would loop up to ``k`` times (and a `tl.sort` of the
    list compiles to thousands of lines)."""
    keys = _ordered_key(vals)
    chosen = k * 0
    for bit in tl.static_range(31, LOW_BITS - 1, -1):
        trial = chosen | (1 << bit)
        chosen = tl.where(tl.sum((keys >= trial).to(tl.int32), 0) >= k, trial, chosen)
    return _threshold(chosen)


@triton.jit
def _top_k_candidates(x_row, cand_val_row, cand_idx_row, V, k, BLOCK: tl.constexpr, CAP: tl.constexpr,
                      SUB: tl.constexpr, LOW_BITS: tl.constexpr):
    """A list of at most ``CAP`` of a row's logits, in index order, that holds its top-k
    set, and the set's threshold: the k-th largest logit. Two passes: the maxima of
    ``SUB``-entry slices, whose k-th largest is a lower bound of the row's (k slices'
    maxima are k logits at or above it), then every finite logit at or above that bound.
    Returns the number listed, which is more than ``CAP`` (nothing usable listed, no
    threshold) when ``k`` exceeds the number of slices -- then no pass runs -- or too many
    logits pass the bound. ``LOW_BITS``: as :func:`_kth_of`'s."""
    PER_BLOCK: tl.constexpr = BLOCK // SUB
    cap = tl.arange(0, CAP)
    slices = tl.cdiv(V, SUB)
    count = CAP + 1
    kth = float("-inf")
    if k <= slices:  # (else fewer than k maxima bound nothing: no pass is worth reading)
        tile = tl.arange(0, PER_BLOCK)[:, None] * SUB + tl.arange(0, SUB)[None, :]
        for start in range(0, V, BLOCK):
            x = _load_logits(x_row, start + tile, V)
            at = start // SUB + tl.arange(0, PER_BLOCK)
            tl.store(cand_val_row + at, tl.max(tl.where(x != x, float("-inf"), x), 1), mask=at < slices)
        tl.debug_barrier()  # every thread's maxima stored before any is read
        bound = _kth_of(tl.load(cand_val_row + cap, mask=cap < slices, other=float("-inf")), k, LOW_BITS)
        tl.debug_barrier()  # read before the list overwrites them
        count = 0
        sub = tl.arange(0, BLOCK)
        for start in range(0, V, BLOCK):
            offs = start + sub
            x = _load_logits(x_row, offs, V)
            keep = (x >= bound) & (x > float("-inf"))  # not NaN, not past the end
            kept = tl.sum(keep.to(tl.int32), 0)
            if kept > 0:  # few blocks hold any: the others skip the scan
                at = count + tl.cumsum(keep.to(tl.int32), 0) - 1
                tl.store(cand_val_row + at, x, mask=keep & (at < CAP))
                tl.store(cand_idx_row + at, offs, mask=keep & (at < CAP))
            count += kept
        if count <= CAP:  # (an overflowing list is not read: the caller takes the radix select)
            tl.debug_barrier()  # the list complete before any thread reads it
            kth = _kth_of(tl.load(cand_val_row + cap, mask=cap < count, other=float("-inf")), k, LOW_BITS)
    return count, kth


@triton.jit
def _entries(x_row, cand_val_row, cand_idx_row, offs, V, n, listed, CAP: tl.constexpr):
    """Logits at ``offs`` of the row, or (``listed``) of its candidate list of ``n``, in
    float32 with their token ids; ``-inf`` (and id ``V``) past the end."""
    if CAP > 0:
        if listed:
            raw = tl.load(cand_val_row + offs, mask=offs < n, other=float("-inf"))
            idx = tl.load(cand_idx_row + offs, mask=offs < n, other=V)
        else:
            raw = _load_logits(x_row, offs, V)
            idx = offs
    else:
        raw = _load_logits(x_row, offs, V)
        idx = offs
    return raw, idx


@triton.jit
def _filtered_race_kernel(x_ptr, temp_ptr, top_k_ptr, top_p_ptr, min_p_ptr, row_seed_ptr, cand_val_ptr, cand_idx_ptr,
                          out_ptr, seed, V, stride_row, HAS_TOP_K: tl.constexpr, HAS_TOP_P: tl.constexpr,
                          HAS_MIN_P: tl.constexpr, HAS_ROW_SEEDS: tl.constexpr, EPS: tl.constexpr, TINY: tl.constexpr,
                          BLOCK: tl.constexpr, MAX_ROUNDS: tl.constexpr, CAP: tl.constexpr, SUB: tl.constexpr):
    # One program a row, in passes over it: the top-k threshold, the min_p threshold (the
    # row's max), the softmax's max and the sum of the kept set, then rounds of a race
    # among the logits above a pivot and a check of the winner; see race_rows_top_k_top_p.
    # Where the top-k set fits a candidate list (CAP > 0), the passes after the threshold
    # read the list, not the row.
    row = tl.program_id(0)
    x_row = x_ptr + row * stride_row
    cand_val_row = cand_val_ptr + row * CAP
    cand_idx_row = cand_idx_ptr + row * CAP
    noise_seed = seed  # round r's noise: Philox(noise_seed + r) at noise_base + the token id
    noise_base = row * V
    if HAS_ROW_SEEDS:
        row_seed = tl.load(row_seed_ptr + row)
        noise_seed = tl.where(row_seed >= 0, row_seed, seed)
        noise_base = tl.where(row_seed >= 0, 0, row * V)
    greedy, scale = _row_scale(temp_ptr, row, EPS)
    # (Values that an `if` may change start as tensors of their type.)
    top_p = tl.where(greedy, 1.0, tl.load(top_p_ptr + row) if HAS_TOP_P else 1.0)  # greedy: in every set
    sub = tl.arange(0, BLOCK)
    kth = tl.where(greedy, float("-inf"), float("-inf"))  # the top-k set: the logits at or above it
    n = V  # entries the passes below read: the row's, or its candidate list's
    listed = greedy & (V < 0)
    if HAS_TOP_K:
        k = tl.load(top_k_ptr + row).to(tl.int64)
        # bf16 widens to float32 keys whose low 16 bits carry nothing (fp16: 13); the radix
        # select's passes take 8 bits, so for fp16 its last one starts at bit 8.
        LOW_BITS: tl.constexpr = 16 if x_ptr.dtype.element_ty == tl.bfloat16 else (
            13 if x_ptr.dtype.element_ty == tl.float16 else 0)
        if (k < V) & (k > 0) & (greedy == 0):
            count = CAP + 1
            if CAP > 0:
                count, kth = _top_k_candidates(x_row, cand_val_row, cand_idx_row, V, k, BLOCK, CAP, SUB, LOW_BITS)
            if count <= CAP:
                n = count
                listed = greedy == 0
            else:
                kth = _kth_largest(x_row, V, k, BLOCK, LOW_BITS // 8 * 8)
    if HAS_MIN_P:
        min_p = tl.load(min_p_ptr + row)
        if (min_p > 0.0) & (greedy == 0):
            # p >= min_p * p_max  <=>  logit / T >= max_logit / T + log(min_p). Both this
            # set and the top-k set hold the largest logits, so applying min_p first (vLLM's
            # order) and then top-k keeps their intersection: the higher threshold.
            top = tl.where(greedy, float("-inf"), float("-inf"))
            for start in range(0, n, BLOCK):  # the row's max (a top-k list holds it)
                raw, _ = _entries(x_row, cand_val_row, cand_idx_row, start + sub, V, n, listed, CAP)
                top = tl.maximum(top, tl.max(tl.where(raw == raw, raw, float("-inf")), 0))
            kth = tl.maximum(kth, top + tl.log(min_p) / scale)
    m = tl.where(greedy, float("-inf"), float("-inf"))
    z = tl.where(greedy, 0.0, 0.0)
    if top_p < 1.0:
        for start in range(0, n, BLOCK):
            raw, _ = _entries(x_row, cand_val_row, cand_idx_row, start + sub, V, n, listed, CAP)
            x = tl.where((raw == raw) & (raw >= kth), raw * scale, float("-inf"))
            new_m = tl.maximum(m, tl.max(x, 0))
            # Until a finite logit comes (a grammar's mask can make whole blocks -inf) the
            # sum stays 0: exp(-inf - -inf) would poison it with a NaN.
            z = tl.where(new_m == float("-inf"), 0.0, z * tl.exp(m - new_m) + tl.sum(tl.exp(x - new_m), 0))
            m = new_m
    low = float("-inf")
    token = 0
    rounds = 0
    accepted = 0
    while (accepted == 0) & (rounds < MAX_ROUNDS):
        best = float("-inf")
        best_idx = V
        for start in range(0, n, BLOCK):
            raw, idx = _entries(x_row, cand_val_row, cand_idx_row, start + sub, V, n, listed, CAP)
            x = raw * scale
            u = tl.rand(noise_seed + rounds, noise_base + idx)
            q = tl.maximum(-tl.log(1.0 - u), TINY)
            key = tl.where((x > low) & (raw >= kth) & (x == x), x - tl.where(greedy, 0.0, tl.log(q)),
                           float("-inf"))
            block_best, block_idx = _first_max(key, idx, V)
            best, best_idx = _later_wins_if_larger(best, best_idx, block_best, block_idx)
        best_idx = tl.minimum(best_idx, V - 1)
        xj = tl.load(x_row + best_idx).to(tl.float32) * scale
        accepted = (top_p >= 1.0).to(tl.int32)
        if top_p < 1.0:
            # The mass strictly above the winner; every logit there is in the top-k set
            # (and so in the candidate list).
            above = tl.where(greedy, 0.0, 0.0)
            for start in range(0, n, BLOCK):
                raw, _ = _entries(x_row, cand_val_row, cand_idx_row, start + sub, V, n, listed, CAP)
                x = raw * scale
                above += tl.sum(tl.where(x > xj, tl.exp(x - m), 0.0), 0)
            accepted = (above < top_p * z).to(tl.int32)
        token = best_idx
        low = xj
        rounds += 1
    # No winner inside the top-p set after MAX_ROUNDS rejections (see race_rows_top_k_top_p):
    # the row's most likely token, which always is in it.
    if accepted == 0:
        best = float("-inf")
        token = V
        for start in range(0, V, BLOCK):
            offs = start + sub
            x = _load_logits(x_row, offs, V)
            block_best, block_idx = _first_max(tl.where(x != x, float("-inf"), x), offs, V)
            best, token = _later_wins_if_larger(best, token, block_best, block_idx)
        token = tl.minimum(token, V - 1)
    tl.store(out_ptr + row, token.to(tl.int64))


#: Rejections after which a top-p row takes its most likely token (see race_rows_top_k_top_p).
MAX_ROUNDS = 64
#: The longest candidate list a top-k row's passes read instead of the row.
CANDIDATES = 2048


def race_rows_top_k_top_p(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor | None,
                          top_p: torch.Tensor | None, seed: int | None = None, block: int = 1024,
                          row_seeds: torch.Tensor | None = None, candidates: int = CANDIDATES,
                          min_p: torch.Tensor | None = None) -> torch.Tensor:
    """One token per row from ``softmax(logits / T)`` cut to its min_p set and its top-k
    set, then to the top-p set of what is left (renormalised), without sorting.

    The min_p set is the tokens whose probability is at least ``min_p`` times the row's
    largest (one more pass over the row, or its candidate list, for the max).

    The top-k set of a row is its logits at or above the k-th largest (ties with it kept).
    Usually two cheap passes find it and list it: the maxima of slices of the row give a
    lower bound of the k-th largest, and the logits at or above the bound (usually a few
    more than ``k``) are copied to a list of at most ``candidates``; the passes after it
    read that list instead of the row, and take the same tokens from the same noise.
    Where the list would overflow (``k`` above the number of slices, or many logits near
    the bound), a radix select over the logits' bits finds the k-th largest (two passes
    for bf16 logits, four for float32) and the passes read the row. The top-p set is the
    tokens whose strictly more probable tokens hold less than ``top_p`` of the top-k
    set's mass (a token tied with the last one kept is kept too). It is never built: a
    round races the top-k set's tokens above a pivot (at first all of them) and checks
    the winner, summing the mass above it. A winner inside the set
    is the row's token -- the race drew it from a superset of the set, so, given that it
    fell inside, from the set -- and one outside raises the pivot to it: every token at or
    below it is outside too. Each round keeps at least ``top_p`` of the candidates' mass
    and a rejection cuts that mass to a uniform-like fraction, so a row rarely needs more
    than a few rounds of two passes; after :data:`MAX_ROUNDS` rejections (vanishingly
    unlikely: the candidates' mass would have had to shrink by little 64 times) it takes
    its most likely token. A row without top-p takes the first round's winner.

    Args:
        logits: As :func:`race_rows` (a NaN logit is never drawn here).
        temperature: ``[rows]`` float32; below ``SAMPLING_EPS``: the row's argmax.
        top_k: ``[rows]`` integers (``V`` or more, or 0: every token), or ``None``: no row
            has a top-k.
        top_p: ``[rows]`` float32 in (0, 1] (1 keeps every token), or ``None``.
        seed: The noise's seed; ``None``: drawn from torch's default CPU generator.
        block: Entries a program reads at a time (a power of two).
        row_seeds: ``[rows]`` int64, or ``None``: a row's own seed, below ``2**62`` (-1: the
            row takes ``seed``). A row with its own seed draws noise from it alone, the
            same whatever the other rows, their number, its place or the other arguments
            that do not touch it (``top_k`` / ``top_p`` tensors present or ``None``).
        candidates: The candidate list's length (a power of two; 0: always the radix
            select and the row).
        min_p: ``[rows]`` float32 in [0, 1] (0: off), or ``None``.

    Returns:
        ``[rows]`` int64 token ids.
    """
    rows, v = logits.shape
    if candidates & (candidates - 1):
        raise ValueError(f"race_rows_top_k_top_p: candidates must be 0 or a power of two, got {candidates}")
    seed = _seed("race_rows_top_k_top_p", logits, seed, MAX_ROUNDS)  # round r draws with seed + r
    out = torch.empty(rows, dtype=torch.int64, device=logits.device)
    unused = temperature  # a pointer for the tensors a constexpr flag says are absent
    # Slices small enough that their maxima fit the list (they are listed there first).
    sub = triton.next_power_of_2(triton.cdiv(v, candidates)) if candidates else 0
    cap = candidates if top_k is not None and 0 < sub <= block else 0
    cand_val = torch.empty((rows, cap), dtype=torch.float32, device=logits.device) if cap else unused
    cand_idx = torch.empty((rows, cap), dtype=torch.int32, device=logits.device) if cap else unused
    _filtered_race_kernel[(rows,)](logits, temperature, unused if top_k is None else top_k,
                                   unused if top_p is None else top_p, unused if min_p is None else min_p,
                                   unused if row_seeds is None else row_seeds, cand_val, cand_idx, out, seed, v,
                                   logits.stride(0), HAS_TOP_K=top_k is not None, HAS_TOP_P=top_p is not None,
                                   HAS_MIN_P=min_p is not None, HAS_ROW_SEEDS=row_seeds is not None,
                                   EPS=SAMPLING_EPS, TINY=_TINY, BLOCK=block, MAX_ROUNDS=MAX_ROUNDS, CAP=cap,
                                   SUB=max(sub, 1), num_warps=8)
    return out


__all__ = ["CANDIDATES", "MAX_ENTRIES", "MAX_ROUNDS", "race_rows", "race_rows_top_k_top_p"]

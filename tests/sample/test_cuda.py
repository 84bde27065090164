"""The same sampling guarantees with the batch and logits on a CUDA device."""

import pytest
import torch

from forkless import SamplingParams
from forkless.sample import Sampler
from sample_helpers import VOCAB, fill, step

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

FORCE = "sample_force_token:ForceTokenLogitsProcessor"


def _seeded_tokens(neighbours: int, neighbour: SamplingParams | None = None) -> list[int]:
    params = [neighbour or SamplingParams(temperature=0.8, top_k=5) for _ in range(neighbours)]
    params.append(SamplingParams(seed=11, top_p=0.9, min_p=0.01, repetition_penalty=1.2))
    batch = fill(params, device="cuda")
    target = f"r{neighbours}"
    for t in range(6):
        logits = torch.randn(len(params), VOCAB, device="cuda")
        logits[batch.req_id_to_index[target]] = torch.randn(
            VOCAB, generator=torch.Generator().manual_seed(t)
        ).cuda()
        step(batch, logits)
    return list(batch.output_token_ids(target))


def test_seeded_rows_are_independent_of_the_batch_on_cuda():
    # The seeded row races in the kernel with its own seed, whatever its neighbours need
    # (top-k, top-p, none, logprobs, another seed).
    alone = _seeded_tokens(0)
    assert alone == _seeded_tokens(3) == _seeded_tokens(9)
    for other in (SamplingParams(temperature=1.0), SamplingParams(temperature=0.5, top_p=0.5),
                  SamplingParams(temperature=0.0), SamplingParams(temperature=0.9, logprobs=2, seed=5)):
        assert _seeded_tokens(4, other) == alone, other


def test_seeded_rows_draw_from_the_distribution_on_cuda():
    # 2,000 rows, each its own seed, one step: the seeds' draws have the tempered
    # softmax's frequencies (and top-k's set); the same seeds again, the same draws.
    torch.manual_seed(1)
    base = torch.randn(VOCAB, device="cuda")
    rows = 1000
    params = [SamplingParams(temperature=0.7, seed=s) for s in range(rows)]
    params += [SamplingParams(temperature=0.7, top_k=4, seed=rows + s) for s in range(rows)]
    logits = base.repeat(2 * rows, 1)
    first = [fill(params[:rows], device="cuda"), fill(params[rows:], device="cuda")]
    drawn = [step(batch, logits[:rows]).sampled_token_ids for batch in first]
    counts = torch.bincount(drawn[0], minlength=VOCAB).float() / rows
    assert (counts - torch.softmax(base / 0.7, dim=0)).abs().max().item() < 0.06  # 5 sigma at 1,000
    top4 = base.topk(4).indices
    kept = torch.zeros(VOCAB, device="cuda").index_copy_(0, top4, torch.softmax(base[top4] / 0.7, dim=0))
    counts = torch.bincount(drawn[1], minlength=VOCAB).float() / rows
    assert (counts - kept).abs().max().item() < 0.06 and set(drawn[1].tolist()) <= set(top4.tolist())
    again = fill(params[:rows], device="cuda")
    assert torch.equal(step(again, logits[:rows]).sampled_token_ids, drawn[0])


def test_processors_and_logprobs_on_cuda():
    eos = 2
    logits = torch.zeros(3, VOCAB, device="cuda")
    logits[:, eos] = 10.0
    first = SamplingParams(temperature=0, min_tokens=2, logprobs=2)
    first.update_from_generation_config({}, model_eos_token_id=eos)
    batch = fill(
        [first, SamplingParams(temperature=0, logit_bias={7: 50.0}),
         SamplingParams(extra_args={"force_token": 5}, frequency_penalty=0.5)],
        custom=[FORCE], device="cuda",
    )
    out = step(batch, logits)
    assert out.sampled_token_ids.device.type == "cuda"
    assert out.sampled_token_ids.tolist()[1:] == [7, 5]
    assert out.sampled_token_ids[0].item() != eos
    assert out.logprobs.ranks[1].item() == 2  # raw: token 7 is second to EOS


def test_few_rows_argmax_on_cuda_equals_torch():
    # row_argmax sends up to FEW_ROWS rows of a vocabulary's width to the Triton argmax.
    from argmax_cases import cases

    from forkless.sample.argmax import FEW_ROWS, row_argmax

    for x in cases("cuda"):
        for rows in (1, 2, FEW_ROWS, FEW_ROWS + 1):
            assert row_argmax(x[:rows]).tolist() == x[:rows].argmax(dim=-1).tolist(), (x.dtype, x.shape, rows)


def test_cuda_sampler_kernels_can_be_turned_off(monkeypatch):
    batch = fill([SamplingParams(temperature=0.7, top_k=5)], device="cuda")
    logits = torch.randn(1, VOCAB, device="cuda")
    assert Sampler.races_in_one_pass(logits, batch.refresh())
    monkeypatch.setenv("FORKLESS_CUDA_SAMPLER", "0")
    assert not Sampler.races_in_one_pass(logits, batch.refresh())
    assert step(batch, logits).sampled_token_ids.item() in logits[0].topk(5).indices.tolist()


def test_temperature_only_rows_race_in_one_pass_on_cuda():
    # The API's default sampling (a temperature, nothing else) goes to the one-pass race:
    # its draws have the PyTorch race's distribution, greedy rows beside them their argmax;
    # top-k, top-p and min_p rows race without a sort; a row with a seed, logprobs or
    # another logits processor keeps the PyTorch path.
    from forkless.sample.race_triton import race_rows, race_rows_top_k_top_p

    torch.manual_seed(0)  # the logits and the kernels' seeds: one outcome, run after run
    rows = 1000  # (the helpers' batch holds 1,024) x 4 steps: 4,000 draws
    params = [SamplingParams(temperature=0.7, max_tokens=4) for _ in range(rows)]
    params += [SamplingParams(temperature=0, max_tokens=4) for _ in range(4)]
    batch = fill(params, device="cuda")
    base = torch.randn(VOCAB, device="cuda")
    logits = base.repeat(rows + 4, 1)
    logits[rows:] = torch.randn(4, VOCAB, device="cuda")
    metadata = batch.refresh()
    assert Sampler.races_in_one_pass(logits, metadata)
    draws = []
    for _ in range(4):  # a new seed each step
        tokens = Sampler()(logits.clone(), metadata).sampled_token_ids
        assert tokens[rows:].tolist() == logits[rows:].argmax(dim=-1).tolist()
        draws.append(tokens[:rows])
    assert not torch.equal(draws[0], draws[1])
    counts = torch.bincount(torch.cat(draws), minlength=VOCAB).float() / (4 * rows)
    want = torch.softmax(base / 0.7, dim=0)
    assert (counts - want).abs().max().item() < 0.04, (counts, want)  # 5 sigma at 4,000 draws
    # bf16 logits, as the model gives them, the same way.
    half = race_rows(base.to(torch.bfloat16).repeat(4 * rows, 1), torch.full((4 * rows,), 0.7, device="cuda"))
    counts = torch.bincount(half, minlength=VOCAB).float() / (4 * rows)
    assert (counts - torch.softmax(base.to(torch.bfloat16).float() / 0.7, dim=0)).abs().max().item() < 0.04

    # Top-p too, without a sort: the same set as the PyTorch path's (no ties in these
    # logits), renormalised.
    top_p = fill([SamplingParams(temperature=0.7, top_p=0.8, max_tokens=4) for _ in range(rows)], device="cuda")
    metadata = top_p.refresh()
    assert Sampler.races_in_one_pass(logits[:rows], metadata)
    drawn = torch.cat([Sampler()(logits[:rows].clone(), metadata).sampled_token_ids for _ in range(4)])
    probs = torch.softmax(base / 0.7, dim=0)
    above = torch.stack([probs[probs > probs[v]].sum() for v in range(VOCAB)])
    kept = torch.where(above < 0.8, probs, 0.0)
    counts = torch.bincount(drawn, minlength=VOCAB).float() / (4 * rows)
    assert (counts - kept / kept.sum()).abs().max().item() < 0.04, (counts, kept / kept.sum())
    assert set(drawn.tolist()) <= set(kept.nonzero().flatten().tolist())  # none from outside the set

    # Top-k, then top-p over what it kept (Qwen3's generation_config sets both): the PyTorch
    # path's set, renormalised. top_k=10 keeps the 10 largest (no ties here), of which
    # top_p=0.8 keeps those whose more probable ones hold < 0.8 of the 10's mass.
    for k, p in ((10, None), (10, 0.8), (3, 0.95)):
        both = fill([SamplingParams(temperature=0.7, top_k=k, top_p=p or 1.0, max_tokens=4) for _ in range(rows)],
                    device="cuda")
        metadata = both.refresh()
        assert Sampler.races_in_one_pass(logits[:rows], metadata)
        drawn = torch.cat([Sampler()(logits[:rows].clone(), metadata).sampled_token_ids for _ in range(4)])
        kept = torch.where(probs >= probs.sort(descending=True).values[k - 1], probs, 0.0)
        kept = kept / kept.sum()
        if p is not None:
            above = torch.stack([kept[kept > kept[v]].sum() for v in range(VOCAB)])
            kept = torch.where(above < p, kept, 0.0)
        counts = torch.bincount(drawn, minlength=VOCAB).float() / (4 * rows)
        assert (counts - kept / kept.sum()).abs().max().item() < 0.04, (k, p, counts, kept / kept.sum())
        assert set(drawn.tolist()) <= set(kept.nonzero().flatten().tolist()), (k, p)
    # bf16 logits of Qwen3's vocabulary width (a radix select over 149 blocks a row), a
    # different k a row: each row's draw is among its k largest.
    wide = torch.randn(256, 151936, device="cuda").to(torch.bfloat16)
    ks = torch.randint(1, 200, (256,), device="cuda")
    got = race_rows_top_k_top_p(wide, torch.full((256,), 0.9, device="cuda"), ks, None)
    kth = wide.float().sort(dim=-1, descending=True).values.gather(1, (ks - 1).unsqueeze(1)).squeeze(1)
    assert (wide.float().gather(1, got.unsqueeze(1)).squeeze(1) >= kth).all()
    # Its candidate list (the logits at or above a bound from slices' maxima) takes the
    # radix select's tokens from the same seed, top-p after it too; rows it cannot list
    # (k above the slices' number, a row of ties) go to the radix select.
    ks[:8] = torch.tensor([1, 2, 20, 50, 300, 1500, 100_000, 20], device="cuda")
    wide[7] = 0.5
    p95 = torch.full((256,), 0.95, device="cuda")
    for seed in range(3):
        listed = race_rows_top_k_top_p(wide, torch.full((256,), 0.9, device="cuda"), ks, p95, seed=seed)
        radix = race_rows_top_k_top_p(wide, torch.full((256,), 0.9, device="cuda"), ks, p95, seed=seed, candidates=0)
        assert torch.equal(listed, radix), (listed != radix).nonzero()
    # Narrower rows (slices of 1 and 2 logits: the first list written had every row draw
    # its argmax on an H100), and bf16 rows with fewer finite logits than k (their
    # threshold -inf: the radix path's was a NaN, which left token V-1).
    for width in (32, 1000, 4096):
        narrow = (torch.randn(64, width, device="cuda") * 2).to(torch.bfloat16)
        narrow[:4, 3:] = float("-inf")
        ks = torch.randint(1, 30, (64,), device="cuda")
        for seed in range(2):
            drawn = [race_rows_top_k_top_p(narrow, torch.full((64,), 0.7, device="cuda"), ks, p95[:64], seed=seed,
                                           candidates=c) for c in (2048, 0)]
            assert torch.equal(drawn[0], drawn[1]), (width, (drawn[0] != drawn[1]).nonzero())
            assert (drawn[0][:4] < 3).all(), drawn[0][:4]

    # min_p in the kernel too (relative to the tempered distribution, applied before top-k
    # and top-p): the built-in processor's set, renormalised; beside rows without it.
    for min_p, k in ((0.05, None), (0.2, 3)):
        rows_p = [SamplingParams(temperature=0.7, min_p=min_p, top_k=k or 0, max_tokens=4) for _ in range(rows)]
        batch = fill(rows_p + [SamplingParams(temperature=0.7, max_tokens=4)], device="cuda")
        metadata = batch.refresh()
        assert Sampler.races_in_one_pass(logits[:rows + 1], metadata)
        drawn = torch.cat([Sampler()(logits[:rows + 1].clone(), metadata).sampled_token_ids[:rows]
                           for _ in range(4)])
        kept = torch.where(probs >= min_p * probs.max(), probs, 0.0)
        if k is not None:
            kept = torch.where(kept >= kept.sort(descending=True).values[k - 1], kept, 0.0)
        counts = torch.bincount(drawn, minlength=VOCAB).float() / (4 * rows)
        assert (counts - kept / kept.sum()).abs().max().item() < 0.04, (min_p, k, counts, kept / kept.sum())
        assert set(drawn.tolist()) <= set(kept.nonzero().flatten().tolist()), (min_p, k)
    # ... and at Qwen3's width, bf16, against its radix path and the sampler's PyTorch set.
    wide = (torch.randn(64, 151936, device="cuda") * 2).to(torch.bfloat16)
    mp, t = torch.full((64,), 0.1, device="cuda"), torch.full((64,), 0.8, device="cuda")
    ks = torch.full((64,), 20, device="cuda")
    for seed in range(2):
        listed = race_rows_top_k_top_p(wide, t, ks, p95[:64], seed=seed, min_p=mp)
        radix = race_rows_top_k_top_p(wide, t, ks, p95[:64], seed=seed, min_p=mp, candidates=0)
        assert torch.equal(listed, radix)
        alone = race_rows_top_k_top_p(wide, t, None, None, seed=seed, min_p=mp)
        tempered = wide.float() / 0.8
        ok = tempered.gather(1, alone.unsqueeze(1)) >= tempered.amax(dim=1, keepdim=True) + torch.log(mp).unsqueeze(1)
        assert ok.all()

    for other in (SamplingParams(temperature=0.7, seed=3), SamplingParams(temperature=0.7, logprobs=1),
                  SamplingParams(temperature=0.7, min_p=0.1, logit_bias={3: 1.0})):
        assert not Sampler.races_in_one_pass(logits[:2], fill([params[0], other], device="cuda").refresh())

    # min_p (and penalties, logprobs, other processors) run as PyTorch ops, then top-k /
    # top-p race in the kernel: min_p first, as vLLM (see test_sampler's CPU twin).
    probs = torch.tensor([0.5, 0.3, 0.1, 0.1] + [0.0] * (VOCAB - 4), device="cuda") + 1e-12
    batch = fill([SamplingParams(min_p=0.3, top_p=0.6, logprobs=1) for _ in range(150)]
                 + [SamplingParams(min_p=0.3, top_k=3, repetition_penalty=1.0 + 1e-6) for _ in range(150)]
                 + [SamplingParams(temperature=0, min_p=0.3)], device="cuda")
    out = step(batch, probs.log().expand(301, VOCAB).contiguous()).sampled_token_ids.tolist()
    assert set(out[:150]) == {0} and set(out[150:300]) == {0, 1} and out[300] == 0

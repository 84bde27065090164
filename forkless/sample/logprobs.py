"""Log-probabilities of sampled tokens, their ranks, and the top-k alternatives."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class LogprobsTensors:
    """Logprobs of one step, row-aligned with the sampled tokens.

    Column 0 is the sampled token; columns ``1..k`` are the top-k tokens, best first.

    Attributes:
        token_ids: ``[B, 1 + k]`` int64.
        logprobs: ``[B, 1 + k]`` float32.
        ranks: ``[B]`` int64, the sampled token's 1-based rank (1 = most likely).
    """

    token_ids: torch.Tensor
    logprobs: torch.Tensor
    ranks: torch.Tensor

    def tolists(
        self, num_logprobs: list[int | None]
    ) -> list[tuple[list[int], list[float], int] | None]:
        """Move to host and trim each row to what its request asked for.

        Args:
            num_logprobs: Per row, ``SamplingParams.logprobs`` (``None``: not asked).

        Returns:
            Per row, ``(token_ids, logprobs, sampled_rank)`` with ``1 + n`` entries
            (sampled token first, then the top n), or ``None`` for rows that did not ask.
        """
        ids = self.token_ids.tolist()
        lps = self.logprobs.tolist()
        ranks = self.ranks.tolist()
        out: list[tuple[list[int], list[float], int] | None] = []
        for row, n in enumerate(num_logprobs):
            out.append(None if n is None else (ids[row][: 1 + n], lps[row][: 1 + n], ranks[row]))
        return out


def gather_logprobs(
    logprobs: torch.Tensor, num_logprobs: int, token_ids: torch.Tensor
) -> LogprobsTensors:
    """Pick the chosen tokens' logprobs and ranks plus the top ``num_logprobs``.

    Also usable for prompt logprobs (``token_ids`` = the next prompt tokens).

    Args:
        logprobs: ``[B, V]`` log-softmax values.
        num_logprobs: How many top alternatives to include (0 allowed).
        token_ids: ``[B]`` the chosen tokens.

    Returns:
        The tensors, still on the logits' device.
    """
    token_ids = token_ids.long().unsqueeze(1)
    chosen = logprobs.gather(1, token_ids)
    # Rank = 1 + number of strictly more likely tokens, so tied tokens share a rank.
    ranks = (logprobs > chosen).sum(dim=1) + 1
    if num_logprobs > 0:
        top_values, top_ids = logprobs.topk(num_logprobs, dim=1)
        ids = torch.cat([token_ids, top_ids], dim=1)
        values = torch.cat([chosen, top_values], dim=1)
    else:
        ids, values = token_ids, chosen
    return LogprobsTensors(token_ids=ids, logprobs=values, ranks=ranks)

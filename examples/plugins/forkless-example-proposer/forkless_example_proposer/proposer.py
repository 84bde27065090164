"""A proposer that chains bigrams: after token ``t``, guess what last followed ``t``.

For each request, the draft starts from its last token and follows, k times, the token
that most recently came right after the current one in the request's own history.
"""

from __future__ import annotations

from forkless.spec_decode import ProposalBatch, Proposer


class BigramProposer(Proposer):
    """Chained bigram lookup over each request's prompt and output."""

    def propose(self, batch: ProposalBatch) -> list[list[int]]:
        drafts = []
        for row, length in zip(batch.token_ids, batch.num_tokens):
            history = row[: int(length)]
            # Later pairs overwrite earlier ones: the most recent successor wins.
            successor = dict(zip(history[:-1].tolist(), history[1:].tolist()))
            token, draft = int(history[-1]), []
            for _ in range(self.num_speculative_tokens):
                if token not in successor:
                    break
                token = successor[token]
                draft.append(token)
            drafts.append(draft)
        return drafts


__all__ = ["BigramProposer"]

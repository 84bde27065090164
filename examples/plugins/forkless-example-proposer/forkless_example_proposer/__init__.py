"""Registers ``BigramProposer`` as the speculative method ``example_bigram`` — by path.

This function runs in every forkless process; it is re-entrant (the same path twice is a
no-op) and cheap: the proposer class is imported only when a worker builds it, for
``--speculative-config '{"method": "example_bigram", "num_speculative_tokens": 3}'``.
"""


def register() -> None:
    from forkless.spec_decode import ProposerRegistry

    ProposerRegistry.register("example_bigram", "forkless_example_proposer.proposer:BigramProposer")

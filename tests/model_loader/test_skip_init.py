"""The loader builds models without drawing random initial weights, and leaves
``torch.nn.init`` as it found it."""

from __future__ import annotations

import pytest
import torch

from forkless.model_loader.loader import skip_random_init


def test_random_initialisers_are_skipped_inside_and_restored_after() -> None:
    before = torch.nn.init.kaiming_uniform_
    with skip_random_init():
        layer = torch.nn.Linear(4, 3)
        t = torch.full((3,), 7.0)
        assert torch.nn.init.normal_(t) is t and torch.equal(t, torch.full((3,), 7.0))
        # Constant initialisers still work (norm weights, biases some layers zero).
        assert torch.equal(torch.nn.init.zeros_(torch.ones(2)), torch.zeros(2))
    assert torch.nn.init.kaiming_uniform_ is before
    assert layer.weight.shape == (3, 4)
    torch.manual_seed(0)
    w = torch.nn.init.normal_(torch.zeros(1000))
    assert w.std() > 0.5  # random again


def test_restored_after_an_error() -> None:
    before = torch.nn.init.uniform_
    with pytest.raises(RuntimeError, match="boom"):
        with skip_random_init():
            raise RuntimeError("boom")
    assert torch.nn.init.uniform_ is before

"""Sampling: the persistent input batch, its metadata, and the sampler (worker side)."""

from forkless.sample.input_batch import InputBatch
from forkless.sample.logprobs import LogprobsTensors, gather_logprobs
from forkless.sample.metadata import SamplingMetadata
from forkless.sample.sampler import Sampler, SamplerOutput

__all__ = [
    "InputBatch",
    "LogprobsTensors",
    "Sampler",
    "SamplerOutput",
    "SamplingMetadata",
    "gather_logprobs",
]

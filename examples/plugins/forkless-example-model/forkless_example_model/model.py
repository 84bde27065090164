"""The model class: a Llama under another architecture name. Imported only in workers."""

from forkless.models.llama import LlamaForCausalLM

from forkless_example_model import _record

_record("model module imported")


class ToyLlamaForCausalLM(LlamaForCausalLM):
    """Identical to Llama; a real plugin would define its own layers here."""

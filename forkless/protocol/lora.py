"""The LoRA adapter a request names, as it crosses processes (msgpack via msgspec).

Invariants:
    * A plain, frozen msgspec struct: it travels inside ``EngineCoreRequest`` (API server
      -> engine core) and ``ScheduledRequest`` (engine core -> worker) and decodes back
      into this class.
    * ``lora_int_id`` identifies the adapter inside one engine: two requests with the same
      id use the same weights; ``lora_name`` is what clients call it and what the
      prefix-cache key holds, so two adapters never share cached blocks.
"""

from __future__ import annotations

import msgspec


class LoRARequest(msgspec.Struct, frozen=True, kw_only=False):
    """A LoRA adapter for a request (vLLM's ``LoRARequest``, positional order kept).

    Attributes:
        lora_name: The adapter's name (the ``model`` field that selects it on the server).
        lora_int_id: A positive integer, unique per adapter within one engine.
        lora_path: A local folder holding a PEFT adapter (``adapter_config.json`` and
            ``adapter_model.safetensors``).
        base_model_name: The model the adapter was trained on, when known (informative:
            the server's ``/v1/models`` lists adapters under the served model).
        tensorizer_config_dict: vLLM's tensorizer loading; not supported (must be ``None``).
        load_inplace: Read the adapter from ``lora_path`` again although an adapter with
            this id is loaded, and replace it (vLLM's: a new checkpoint under the same id,
            as an RL loop writes one each step); requests already running with the id use
            the new weights from their next step.
    """

    lora_name: str
    lora_int_id: int
    lora_path: str = ""
    base_model_name: str | None = None
    tensorizer_config_dict: dict | None = None
    load_inplace: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.lora_name, str) or not self.lora_name:
            raise ValueError(f"LoRARequest.lora_name must be a non-empty string, got {self.lora_name!r}")
        if isinstance(self.lora_int_id, bool) or not isinstance(self.lora_int_id, int) or self.lora_int_id < 1:
            raise ValueError(f"LoRARequest.lora_int_id must be an integer >= 1, got {self.lora_int_id!r} "
                             f"(adapter {self.lora_name!r})")
        if self.tensorizer_config_dict is not None:
            raise ValueError(f"LoRARequest.tensorizer_config_dict is not supported (adapter {self.lora_name!r}): "
                             "forkless reads PEFT safetensors folders")
        if not isinstance(self.load_inplace, bool):
            raise ValueError(f"LoRARequest.load_inplace must be a bool, got {self.load_inplace!r}")
        if not isinstance(self.lora_path, str) or not self.lora_path:
            raise ValueError(f"LoRARequest.lora_path must name the adapter's folder, got {self.lora_path!r} "
                             f"(adapter {self.lora_name!r})")

    @property
    def adapter_id(self) -> int:
        """``lora_int_id`` (vLLM's alias)."""
        return self.lora_int_id

    @property
    def name(self) -> str:
        """``lora_name`` (vLLM's alias)."""
        return self.lora_name

    @property
    def path(self) -> str:
        """``lora_path`` (vLLM's alias)."""
        return self.lora_path

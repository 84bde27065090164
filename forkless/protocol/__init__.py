"""Every message that crosses a forkless process boundary, in one leaf package.

Invariants:
    * Modules here import only the standard library, msgspec, pydantic,
      ``forkless.sampling_params`` and the extension system ``forkless.plugins`` (for the
      deprecation helper); every other forkless package may import them, and they import
      none of those (``tests/test_layering.py`` checks it).
    * Nothing here is pickled: msgspec encodes the step and engine messages to msgpack and
      decodes them back into the same types.

Modules:
    step: scheduler -> model runner -> scheduler -> engine (``SchedulerOutput``,
        ``ModelRunnerOutput``, ``EngineCoreOutput``, ``SchedulerStats``).
    engine: API server <-> engine core (``EngineCoreRequest``, ``EngineCoreOutputs``).
    lora: ``LoRARequest``, the adapter a request names (inside the two above).
    kv_transfer: what KV connectors report back from the workers (inside ``step``).
    ipc: the ZeroMQ frame format and message kinds shared by those two boundaries.
    shared_memory: the named segments a step's grammar bitmask crosses in (the engine
        core or the grammar process fills them, worker processes read them).
    openai: the OpenAI-compatible HTTP request and response bodies (client <-> API server).

Submodules are not imported here, so that ``import forkless.protocol.step`` does not pull
in pydantic.
"""

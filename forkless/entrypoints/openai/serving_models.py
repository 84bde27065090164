"""The models a server answers to: the served model and its LoRA adapters (vLLM's
``OpenAIServingModels``).

Invariants:
    * A request's ``model`` is the served model's name (no adapter), a loaded adapter's
      name (that adapter), or, with runtime updating on, a name a registered resolver
      finds (loaded, then served); anything else is a 404 ``model_not_found`` naming the
      known models.
    * Every adapter is checked before it is listed (``Processor.check_lora``: torch-free,
      in the tokenizer thread), so a bad folder is the caller's 400 and never reaches the
      engine.
    * Adapter ids are this server's own, from 1 up, never reused: a name unloaded and
      loaded again gets a new id, so its old prefix-cache blocks and worker copy are not
      mistaken for the new one.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from forkless import envs
from forkless.entrypoints.openai.errors import BadRequest, quoted
from forkless.logger import init_logger
from forkless.lora import LoRARequest
from forkless.lora.registry import LoRAResolverRegistry
from forkless.protocol.openai import ModelCard

if TYPE_CHECKING:
    from forkless.engine.async_llm import AsyncLLM

logger = init_logger("forkless.entrypoints.openai")


@dataclass(frozen=True)
class LoRAModulePath:
    """One ``--lora-modules`` entry.

    Attributes:
        name: The ``model`` name clients use.
        path: The adapter's folder.
        base_model_name: The base model it was trained for, when given (listed as its
            ``parent`` when it is one of the served names, as vLLM lists it; else the
            served model).
    """

    name: str
    path: str
    base_model_name: str | None = None


def parse_lora_module(value: str) -> LoRAModulePath:
    """Parse one ``--lora-modules`` value: ``name=path`` or the JSON form
    ``{"name": ..., "path": ..., "base_model_name": ...}``.

    Raises:
        ValueError: Neither form, naming the value and what is expected.
    """
    text = value.strip()
    if text.startswith("{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--lora-modules {value!r} is not valid JSON: {exc}") from None
        if not isinstance(data, dict) or not isinstance(data.get("name"), str) or not isinstance(data.get("path"), str):
            raise ValueError(f"--lora-modules {value!r}: the JSON form needs string fields \"name\" and \"path\" "
                             "(and optionally \"base_model_name\")")
        unknown = set(data) - {"name", "path", "base_model_name"}
        if unknown:
            raise ValueError(f"--lora-modules {value!r}: unknown field(s) {', '.join(sorted(unknown))}; expected "
                             "name, path, base_model_name")
        name, path, base = data["name"], data["path"], data.get("base_model_name")
    else:
        name, sep, path = text.partition("=")
        base = None
        if not sep:
            raise ValueError(f"--lora-modules {value!r}: expected name=path or a JSON object "
                             "{\"name\": ..., \"path\": ...}")
    if not name or not path:
        raise ValueError(f"--lora-modules {value!r}: the name and the path must both be non-empty")
    return LoRAModulePath(name, path, base)


class ServingModels:
    """The served model's names and the LoRA adapters loaded under this server.

    Args:
        engine: The engine (its processor checks adapters).
        served_model_names: Names of the base model; the first is reported.
        max_model_len: For the model cards.
    """

    def __init__(self, engine: "AsyncLLM", served_model_names: list[str], max_model_len: int) -> None:
        self.engine = engine
        self.served_model_names = served_model_names
        self.base_model_name = served_model_names[0]
        self.max_model_len = max_model_len
        self.loras: dict[str, LoRARequest] = {}
        self._parents: dict[str, str] = {}
        self._ids = itertools.count(1)
        # Names being loaded by a resolver: concurrent requests for one wait for one load.
        self._resolving: dict[str, asyncio.Task[LoRARequest | None]] = {}
        self.run_blocking: Callable[..., Awaitable[Any]] = self._to_thread

    @staticmethod
    async def _to_thread(fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.to_thread(fn, *args)

    @property
    def lora_enabled(self) -> bool:
        """Whether the engine serves LoRA adapters (``--enable-lora``)."""
        return self.engine.config.lora_config is not None

    @property
    def runtime_updating(self) -> bool:
        """Whether adapters may be loaded and unloaded while serving."""
        return envs.FORKLESS_ALLOW_RUNTIME_LORA_UPDATING and self.lora_enabled

    # ---------------------------------------------------------------- adapters

    async def add_lora(self, name: str, path: str, base_model_name: str | None = None,
                       load_inplace: bool = False) -> LoRARequest:
        """Check an adapter folder and serve it under ``name``; with ``load_inplace``, an
        adapter served under ``name`` already is read again from ``path`` and replaced
        (same id; the next request with it reloads it in the workers).

        Raises:
            BadRequest: LoRA is off, the name is taken, or the adapter is malformed (400).
        """
        if not name or not path:  # vLLM's answer
            raise BadRequest("Both 'lora_name' and 'lora_path' must be provided.", "lora_name" if not name else
                             "lora_path", err_type="InvalidUserInput")
        if not self.lora_enabled:
            raise BadRequest("LoRA adapters need a server started with --enable-lora", "lora_name")
        if load_inplace and name in self.loras:
            old = self.loras[name]
            lora = LoRARequest(name, old.lora_int_id, path, old.base_model_name)
            try:
                await self.run_blocking(self.engine.processor.replace_lora_weights, lora)
            except ValueError as exc:
                raise BadRequest(str(exc), "lora_path", err_type="InvalidUserInput") from None
            self.loras[name] = lora
            logger.info("LoRA adapter %r (id %d) replaced in place from %s", name, lora.lora_int_id, path)
            return lora
        if name in self.served_model_names:
            raise BadRequest(f"'{quoted(name)}' is the served model's name; give the LoRA adapter another one",
                             "lora_name", err_type="InvalidUserInput")
        self._refuse_loaded(name)
        lora = LoRARequest(name, next(self._ids), path, base_model_name)
        try:
            await self.run_blocking(self.engine.processor.check_lora, lora)
        except ValueError as exc:
            raise BadRequest(str(exc), "lora_path", err_type="InvalidUserInput") from None
        self._refuse_loaded(name)  # loaded by a concurrent call while this one was checking
        self._install(lora)
        return lora

    def _refuse_loaded(self, name: str) -> None:
        if name in self.loras:  # vLLM's message
            raise BadRequest(f"The lora adapter '{quoted(name)}' has already been loaded. If you want to load "
                             "the adapter in place, set 'load_inplace' to True.", "lora_name",
                             err_type="InvalidUserInput")

    def _install(self, lora: LoRARequest) -> None:
        self.loras[lora.lora_name] = lora
        # As vLLM: the parent is a model this server lists; another base_model_name (the
        # model the adapter was trained from, say) leaves it the served model.
        given = lora.base_model_name
        self._parents[lora.lora_name] = given if given in self.served_model_names else self.base_model_name
        logger.info("LoRA adapter %r (id %d) added from %s", lora.lora_name, lora.lora_int_id, lora.lora_path)

    def remove_lora(self, name: str, lora_int_id: int | None = None) -> None:
        """Stop serving an adapter; requests already running finish with it.

        Args:
            name: The adapter's name.
            lora_int_id: vLLM's optional id of it: when given, it must be the adapter's.

        Raises:
            BadRequest: No name (400), no adapter of that name (404), as vLLM answers, or
                an id that is not the named adapter's (400: it is not ignored).
        """
        if not name:
            raise BadRequest("'lora_name' needs to be provided to unload a LoRA adapter.", "lora_name",
                             err_type="InvalidUserInput")
        lora = self.loras.get(name)
        if lora is None:
            known = ", ".join(quoted(n) for n in self.loras) or "none"
            raise BadRequest(f"The lora adapter '{quoted(name)}' cannot be found (loaded adapters: {known})",
                             "lora_name", err_type="NotFoundError", status=HTTPStatus.NOT_FOUND)
        if lora_int_id is not None and lora_int_id != lora.lora_int_id:
            raise BadRequest(f"lora_int_id {lora_int_id} is not the id of adapter '{quoted(name)}' "
                             f"({lora.lora_int_id}); leave it out to unload by name", "lora_int_id")
        del self.loras[name]
        self._parents.pop(name, None)
        self.engine.processor.forget_lora(lora.lora_int_id)
        logger.info("LoRA adapter %r removed", name)

    def load_static(self, modules: list[LoRAModulePath]) -> None:
        """Check and add the ``--lora-modules`` adapters, before the server takes requests.

        Raises:
            ValueError: LoRA is off, a name is repeated or is the served model's, or an
                adapter is malformed (the message names it).
        """
        for m in modules:
            where = f"--lora-modules {m.name}={m.path}"
            if not self.lora_enabled:
                raise ValueError(f"{where}: LoRA adapters need --enable-lora")
            if m.name in self.served_model_names or m.name in self.loras:
                raise ValueError(f"{where}: the name {m.name!r} is already taken")
            lora = LoRARequest(m.name, next(self._ids), m.path, m.base_model_name)
            self.engine.processor.check_lora(lora)  # its message names the adapter
            self._install(lora)

    # ---------------------------------------------------------------- requests

    async def resolve(self, model: str | None) -> LoRARequest | None:
        """The adapter a request's ``model`` names; ``None`` for the base model (also when
        ``model`` is left out, null or empty, as vLLM takes them).

        Raises:
            BadRequest: 404 ``model_not_found`` naming the known models.
        """
        if not model or model in self.served_model_names:
            return None
        lora = self.loras.get(model)
        if lora is not None:
            return lora
        if self.runtime_updating and LoRAResolverRegistry.get_supported_resolvers():
            lora = await self._resolve_with_plugins(model)
            if lora is not None:
                return lora
        known = ", ".join([*self.served_model_names, *self.loras])
        raise BadRequest(f"The model `{quoted(model)}` does not exist; this server serves {known}", "model",
                         err_type="NotFoundError", status=HTTPStatus.NOT_FOUND, code="model_not_found")

    async def _resolve_with_plugins(self, name: str) -> LoRARequest | None:
        # One task per name, which no request owns: a client that disconnects cancels its
        # own wait, never the resolution the others wait for.
        task = self._resolving.get(name)
        if task is None:
            task = self._resolving[name] = asyncio.ensure_future(self._ask_resolvers(name))

            def done(t: asyncio.Task[LoRARequest | None]) -> None:
                if self._resolving.get(name) is t:
                    del self._resolving[name]
                if not t.cancelled():
                    t.exception()  # retrieved: its waiters get it, nobody else must

            task.add_done_callback(done)
        return await asyncio.shield(task)

    async def _ask_resolvers(self, name: str) -> LoRARequest | None:
        """Each resolver in registration order; the first adapter found that loads is
        served (as vLLM). One found that cannot be loaded leaves the name to the next
        resolver; when none loads, the first such refusal is the request's 400."""
        refused: BadRequest | None = None
        for resolver_name in LoRAResolverRegistry.get_supported_resolvers():
            try:
                resolver = LoRAResolverRegistry.get_resolver(resolver_name)
                # The model as --model gave it, as vLLM passes it (not the served name).
                found = await resolver.resolve_lora(self.engine.model_path, name)
            except Exception as exc:  # a plugin's failure is not the client's
                logger.warning("LoRA resolver %r failed for %r: %s: %s", resolver_name, name,
                               type(exc).__name__, exc)
                continue
            if found is None:
                continue
            if not isinstance(found, LoRARequest):
                logger.warning("LoRA resolver %r returned %r for %r, not a LoRARequest", resolver_name, found, name)
                continue
            if name in self.loras:
                return self.loras[name]
            try:
                lora = await self.add_lora(name, found.lora_path, found.base_model_name)
            except BadRequest as exc:
                if name in self.loras:  # /v1/load_lora_adapter loaded the name meanwhile
                    return self.loras[name]
                logger.warning("LoRA resolver %r found adapter %r at %s, which cannot be loaded: %s", resolver_name,
                               name, found.lora_path, exc.message)
                refused = refused or exc
                continue
            logger.info("LoRA resolver %r found adapter %r at %s", resolver_name, name, found.lora_path)
            return lora
        if refused is not None:
            raise refused
        return None

    # ---------------------------------------------------------------- listing

    def model_cards(self) -> list[ModelCard]:
        """``/v1/models``: the served names, then each adapter with its ``parent``."""
        root = str(self.engine.model_path)
        cards = [ModelCard(id=n, root=root, max_model_len=self.max_model_len) for n in self.served_model_names]
        cards += [ModelCard(id=name, root=lora.lora_path, parent=self._parents.get(name, self.base_model_name),
                            max_model_len=self.max_model_len) for name, lora in self.loras.items()]
        return cards

"""The lazy registry and class-path resolution, in-process."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from forkless.plugins import (
    LazyRegistry,
    PluginImportError,
    RegistryError,
    Stability,
    resolve_class,
    stability,
)


@pytest.fixture()
def fresh_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Write a module file that is importable but not yet imported."""

    def make(name: str, body: str) -> str:
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(body))
        monkeypatch.syspath_prepend(str(tmp_path))
        monkeypatch.delitem(sys.modules, name, raising=False)
        return name

    return make


@pytest.fixture()
def plugin_logs(caplog: pytest.LogCaptureFixture):
    # forkless loggers do not propagate to the root logger; let caplog see them.
    logger = logging.getLogger("forkless")
    logger.addHandler(caplog.handler)
    caplog.set_level(logging.DEBUG, logger="forkless")
    yield caplog
    logger.removeHandler(caplog.handler)


def test_resolve_imports_only_on_first_use(fresh_module) -> None:
    mod = fresh_module("lazy_target_mod", "class Model:\n    pass\n")
    reg: LazyRegistry[type] = LazyRegistry("test thing A")
    reg.register("m", f"{mod}:Model")
    assert mod not in sys.modules
    assert not reg.is_imported("m")
    cls = reg.resolve("m")
    assert cls.__name__ == "Model" and mod in sys.modules
    assert reg.resolve("m") is cls


def test_both_path_spellings_are_the_same_target(plugin_logs) -> None:
    reg: LazyRegistry[type] = LazyRegistry("test thing B")
    reg.register("d", "collections:OrderedDict")
    reg.register("d", "collections.OrderedDict")
    reg.register("d", "collections:OrderedDict")
    assert not [r for r in plugin_logs.records if r.levelno >= logging.WARNING]
    import collections

    assert reg.resolve("d") is collections.OrderedDict
    reg.register("d", collections.OrderedDict)  # the object the path resolved to: same
    assert not [r for r in plugin_logs.records if r.levelno >= logging.WARNING]


def test_different_target_warns_and_newest_wins(plugin_logs) -> None:
    reg: LazyRegistry[type] = LazyRegistry("test thing C")
    reg.register("d", "collections:OrderedDict")
    reg.register("d", "collections:Counter")
    import collections

    assert reg.resolve("d") is collections.Counter
    warnings = [r.getMessage() for r in plugin_logs.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "collections:OrderedDict" in warnings[0] and "collections:Counter" in warnings[0]


def test_unknown_name_lists_registered_names() -> None:
    reg: LazyRegistry[type] = LazyRegistry("test widget", hint="Add one with a plugin.")
    reg.register("beta", "collections:Counter")
    reg.register("alpha", "collections:OrderedDict")
    with pytest.raises(RegistryError) as err:
        reg.resolve("gamma")
    assert str(err.value) == "unknown test widget 'gamma'; registered: alpha, beta. Add one with a plugin."


def test_bad_path_names_path_and_failure(fresh_module) -> None:
    mod = fresh_module("broken_target_mod", "raise RuntimeError('boom at import')\n")
    reg: LazyRegistry[type] = LazyRegistry("test thing D")
    reg.register("x", f"{mod}:Model")
    reg.register("y", "collections:NoSuchThing")
    with pytest.raises(PluginImportError, match=r"'broken_target_mod:Model'.*RuntimeError: boom at import"):
        reg.resolve("x")
    with pytest.raises(PluginImportError, match=r"has no attribute 'NoSuchThing'"):
        reg.resolve("y")
    with pytest.raises(ValueError, match="expected a class path"):
        reg.register("z", "notapath")


def test_a_misspelt_class_path_suggests_the_name(fresh_module) -> None:
    from forkless.plugins import import_path

    mod = fresh_module("typo_target_mod", "class DummyLogitsProcessor: ...\nclass Other: ...\n")
    with pytest.raises(PluginImportError, match=r"has no attribute 'DummyLogitsProcesor'; did you mean "
                                                r"'DummyLogitsProcessor'\?"):
        import_path(f"{mod}:DummyLogitsProcesor")
    with pytest.raises(PluginImportError, match=r"has no attribute 'Zzz' \(its classes: DummyLogitsProcessor, Other\)"):
        import_path(f"{mod}:Zzz")


def test_a_missing_name_lists_the_modules_own_functions_too(fresh_module) -> None:
    """A path may name a function (--middleware, an entry point's callable): a module of
    functions got no list of what it has."""
    from forkless.plugins import import_path

    mod = fresh_module("function_target_mod", "from os.path import join\n"
                       "async def add_process_time(request, call_next): ...\n"
                       "def make_plugin(): ...\n")
    with pytest.raises(PluginImportError, match=r"has no attribute 'add_time' "
                                                r"\(its functions: add_process_time, make_plugin\)$"):
        import_path(f"{mod}:add_time")
    mod = fresh_module("mixed_target_mod", "class Other: ...\ndef helper(): ...\n")
    with pytest.raises(PluginImportError, match=r"\(its classes: Other; its functions: helper\)$"):
        import_path(f"{mod}:Zzz")


def test_registry_checks_base_class() -> None:
    class Base:
        pass

    reg: LazyRegistry[type] = LazyRegistry("test thing E", base=Base)
    reg.register("wrong", "collections:OrderedDict")
    with pytest.raises(TypeError, match="not a subclass of .*Base"):
        reg.resolve("wrong")


@stability(Stability.INTERNAL)
class InternalInterface:
    pass


class CustomImpl(InternalInterface):
    pass


def test_resolve_class_checks_and_warns_once_for_internal(plugin_logs) -> None:
    path = f"{__name__}:CustomImpl"
    assert resolve_class(path, InternalInterface, "--scheduler-cls") is CustomImpl
    assert resolve_class(f"{__name__}.CustomImpl", InternalInterface, "--scheduler-cls") is CustomImpl
    warnings = [r.getMessage() for r in plugin_logs.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "internal and may change" in warnings[0]
    with pytest.raises(TypeError, match="--scheduler-cls: collections.OrderedDict is not a subclass"):
        resolve_class("collections.OrderedDict", InternalInterface, "--scheduler-cls")
    with pytest.raises(TypeError, match="not a class"):
        resolve_class("os.path:join", InternalInterface, "--scheduler-cls")
    with pytest.raises(ValueError, match="--scheduler-cls: expected a class path"):
        resolve_class("nodots", InternalInterface, "--scheduler-cls")
    with pytest.raises(PluginImportError, match="--scheduler-cls: cannot import 'no_such_pkg.mod:C'"):
        resolve_class("no_such_pkg.mod:C", InternalInterface, "--scheduler-cls")


def test_stability_accepts_only_the_enum() -> None:
    with pytest.raises(TypeError, match=r"stability\(\) takes a Stability member \(Stability.PUBLIC, "
                       r"Stability.PROVISIONAL, Stability.INTERNAL\), got 'public'"):
        stability("public")  # type: ignore[arg-type]

    @stability(Stability.PUBLIC)
    class Marked:
        pass

    assert Marked.__forkless_stability__ is Stability.PUBLIC


def test_model_registry_unknown_architecture_suggests_a_plugin() -> None:
    from forkless import ModelRegistry
    from forkless.models.registry import UnsupportedArchitectureError

    assert {"LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"} <= set(ModelRegistry.get_supported_archs())
    fresh = subprocess.run(
        [sys.executable, "-c", "import sys; from forkless import ModelRegistry; "
         "ModelRegistry.get_supported_archs(); print(ModelRegistry.is_imported('Qwen3ForCausalLM'), "
         "'torch' in sys.modules)"], capture_output=True, text=True, check=True)
    assert fresh.stdout.split() == ["False", "False"]  # registered by path only
    with pytest.raises(UnsupportedArchitectureError, match=r"Model architectures \['GPT5ForCausalLM'\] are not "
                       r"supported for now. Supported architectures: \[.*'LlamaForCausalLM'.*register_model"):
        ModelRegistry.resolve_model_cls(["GPT5ForCausalLM"])


def test_model_registry_names_a_registered_class_that_fails_to_import() -> None:
    from forkless import ModelRegistry
    from forkless.models.registry import UnsupportedArchitectureError

    ModelRegistry.register_model("TypoForCausalLM", "no_such_pkg.model:TypoForCausalLM")
    try:
        with pytest.raises(UnsupportedArchitectureError, match=r"\['TypoForCausalLM'\] failed to be inspected: "
                           r"'TypoForCausalLM' is registered as 'no_such_pkg.model:TypoForCausalLM'.*No module"):
            ModelRegistry.resolve_model_cls(["TypoForCausalLM"])
    finally:
        ModelRegistry._registry.unregister("TypoForCausalLM")


def test_a_class_missing_abstract_methods_is_refused_when_named() -> None:
    from forkless.executor import Executor
    from forkless.plugins import LazyRegistry, resolve_class

    class HalfExecutor(Executor):
        def determine_num_blocks(self) -> int:
            return 1

    with pytest.raises(TypeError, match=r"--distributed-executor-backend: .*HalfExecutor does not implement "
                       r"the abstract method\(s\) check_health, execute_model, initialize_cache"):
        resolve_class(HalfExecutor, Executor, "--distributed-executor-backend")
    registry: LazyRegistry[type] = LazyRegistry("test executor", base=Executor)
    registry.register("half_by_path", "forkless.executor.interface:Executor")
    with pytest.raises(TypeError, match="does not implement"):
        registry.resolve("half_by_path")


def test_a_plugins_registrations_name_it_when_they_fail_or_replace(caplog) -> None:
    from forkless.plugins._registry import registering_as

    reg: LazyRegistry[object] = LazyRegistry("widget", base=dict)
    reg.register("plain", "collections:OrderedDict")
    with registering_as("plugin 'acme' of forkless.general_plugins"):
        with caplog.at_level(logging.WARNING, logger="forkless.plugins"):
            reg.register("plain", "nosuch_pkg.widgets:Widget")
        reg.register("list", "builtins:list")
    assert "now replaced by nosuch_pkg.widgets:Widget, by plugin 'acme' of forkless.general_plugins" in caplog.text
    assert reg.owner("plain") == "plugin 'acme' of forkless.general_plugins"
    with pytest.raises(PluginImportError, match=r"\(widget 'plain', registered by plugin 'acme' of "):
        reg.resolve("plain")
    with pytest.raises(TypeError, match=r"widget 'list' -> 'builtins:list' \(registered by plugin 'acme' .* "
                                        "not a subclass of builtins.dict"):
        reg.resolve("list")
    reg.register("list", "collections:OrderedDict")  # outside any plugin: the owner goes with the old target
    assert reg.owner("list") is None and reg.resolve("list").__name__ == "OrderedDict"

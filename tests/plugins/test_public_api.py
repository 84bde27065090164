"""What other packages may use of ``forkless.plugins``, in-process: the exported names,
the one table of entry-point groups, and the parsing of ``FORKLESS_PLUGINS``."""

from __future__ import annotations

import pytest

import forkless.plugins
from forkless.plugins import GROUPS, PluginSelection, ValueKind, import_path


def test_names_other_packages_need_are_public() -> None:
    from forkless.plugins._loader import strict_mode
    from forkless.plugins._parser_manager import ParserManager

    assert forkless.plugins.ParserManager is ParserManager
    assert forkless.plugins.strict_mode is strict_mode
    for name in ("ParserManager", "strict_mode", "import_path", "LazyRegistry", "GROUPS",
                 "GroupSpec", "ValueKind", "PluginSelection", "plugin_selection",
                 "call_plugins_by_group"):
        assert name in forkless.plugins.__all__, name
    assert all(hasattr(forkless.plugins, name) for name in forkless.plugins.__all__)


def test_groups_is_the_one_table_of_entry_point_groups() -> None:
    assert list(GROUPS) == [
        "forkless.general_plugins", "forkless.platform_plugins", "forkless.stat_logger_plugins",
        "forkless.io_processor_plugins", "forkless.logits_processors", "forkless.endpoint_plugins",
    ]
    for name, spec in GROUPS.items():
        assert spec.name == name and spec.value and spec.loaded_in
        # a class group names the interface its values must subclass; a callable one does not
        if spec.kind is ValueKind.CLASS:
            assert isinstance(import_path(spec.interface), type), name
        else:
            assert spec.interface is None, name
    assert [g for g, s in GROUPS.items() if s.opt_in] == ["forkless.endpoint_plugins"]
    assert {g for g, s in GROUPS.items() if s.detector} == {
        "forkless.platform_plugins", "forkless.io_processor_plugins"}
    assert GROUPS["forkless.stat_logger_plugins"].interface == "forkless.metrics:StatLoggerBase"
    assert GROUPS["forkless.logits_processors"].interface == "forkless.logits_processors:LogitsProcessor"
    # the checker keeps no table of its own
    import forkless.plugins._check as check

    assert not hasattr(check, "CALLABLE_GROUPS") and not hasattr(check, "CLASS_GROUP_BASES")


@pytest.mark.parametrize(
    ("raw", "loads", "skips"),
    [
        (None, {"model", "parser"}, {"hello"}),  # unset: all but opt-in
        ("", set(), {"model", "parser", "hello"}),  # empty: none
        (" , ", set(), {"model", "parser", "hello"}),
        ("model", {"model"}, {"parser", "hello"}),  # allow-list
        (" model , hello ", {"model", "hello"}, {"parser"}),
        ("+hello", {"model", "parser", "hello"}, set()),  # default set plus hello
        ("+ hello, +model", {"model", "parser", "hello"}, set()),
        ("model,+hello", {"model", "hello"}, {"parser"}),  # a +name in an allow-list: listed
        ("+", {"model", "parser"}, {"hello"}),  # adds nothing
    ],
)
def test_plugin_selection(raw: str | None, loads: set[str], skips: set[str]) -> None:
    selection = PluginSelection.parse(raw)
    opt_in = {"hello"}
    for name in loads:
        assert selection.allows(name, name in opt_in), (raw, name)
    for name in skips:
        assert not selection.allows(name, name in opt_in), (raw, name)


def test_plugin_selection_suggests_a_value_that_keeps_the_users_choice() -> None:
    assert PluginSelection.parse(None).enabling("hello") == "+hello"
    assert PluginSelection.parse("+a, +b").enabling("hello") == "+a,+b,+hello"
    assert PluginSelection.parse("a, +b").enabling("hello") == "a,+b,hello"
    assert PluginSelection.parse("").enabling("hello") == "hello"

"""ToolHub: the tools of the configured MCP servers, calls that end well or badly, servers that stop."""

from __future__ import annotations

import json
from dataclasses import replace

from app.settings.app_settings import SettingsHolder
from app.storage import load_settings
from app.storage.settings import ToolServerConfig
from app.tools.hub import ToolHub, ToolSpec
from app.tools.naming import function_names

from .conftest import is_running, server_config, started_pids

HUNG_TIMEOUT_S = 1.0


def _named(specs, name: str) -> ToolSpec:
    return next(spec for spec in specs if spec.name == name)


def test_the_tools_are_listed_and_a_call_returns_the_result_text(hub, holder, numbers, run):
    holder.update(tool_servers=(numbers,))

    specs = run(hub.tools())
    outcome = run(hub.call(_named(specs, "add"), {"a": 2, "b": 3.5}, 10))

    assert sorted(spec.name for spec in specs) == ["add", "crash", "fail", "sleep_forever"]
    assert (outcome.status, outcome.text) == ("done", "5.5")
    function = json.loads(_named(specs, "add").openai_json())["function"]
    assert (function["name"], function["description"]) == ("add", "Add two numbers.")
    assert function["parameters"]["required"] == ["a", "b"]
    assert hub.problems() == ()


def test_a_tool_that_raises_gives_an_error_outcome_with_its_message(hub, holder, numbers, run):
    holder.update(tool_servers=(numbers,))
    specs = run(hub.tools())

    outcome = run(hub.call(_named(specs, "fail"), {"message": "the disk is on fire"}, 10))

    assert outcome.status == "error" and "the disk is on fire" in outcome.text


def test_a_hung_tool_times_out_its_server_is_stopped_and_the_next_call_starts_it_again(hub, holder, numbers, pid_file, run, qtbot):
    holder.update(tool_servers=(numbers,))
    specs = run(hub.tools())

    hung = run(hub.call(_named(specs, "sleep_forever"), {}, HUNG_TIMEOUT_S))
    after = run(hub.call(_named(specs, "add"), {"a": 1, "b": 1}, 30))

    assert hung.status == "timeout" and "sleep_forever" in hung.text and "1 s" in hung.text
    assert hung.seconds < HUNG_TIMEOUT_S + 5  # far below the 30 s a connection may take
    assert (after.status, after.text) == ("done", "2")
    first, second = started_pids(pid_file)
    qtbot.waitUntil(lambda: not is_running(first), timeout=30_000)
    assert is_running(second)


def test_a_server_that_crashes_during_a_call_is_reported_and_started_again(hub, holder, numbers, run):
    holder.update(tool_servers=(numbers,))
    specs = run(hub.tools())

    crashed = run(hub.call(_named(specs, "crash"), {}, 10))
    after = run(hub.call(_named(specs, "add"), {"a": 1, "b": 2}, 30))

    assert crashed.status == "error"
    assert "“numbers” stopped during the call" in crashed.text and "crashing on purpose" in crashed.text
    assert (after.status, after.text) == ("done", "3")


def test_a_command_that_does_not_exist_is_a_problem_naming_it(hub, holder, numbers, run):
    missing = ToolServerConfig("ghost", command="hearth-no-such-mcp-server")
    holder.update(tool_servers=(missing, numbers))

    specs = run(hub.tools())
    outcome = run(hub.call(ToolSpec("ghost", "boo", "boo", "", "{}"), {}, 10))

    assert {spec.server for spec in specs} == {"numbers"}
    (problem,) = hub.problems()
    assert "ghost" in problem and '"hearth-no-such-mcp-server" was not found' in problem
    assert outcome.status == "error" and "hearth-no-such-mcp-server" in outcome.text


def test_tools_with_the_same_name_on_two_servers_get_distinct_function_names(hub, holder, pid_file, run):
    holder.update(tool_servers=(server_config("left", pid_file), server_config("right", pid_file)))

    specs = run(hub.tools())
    adds = [spec for spec in specs if spec.name == "add"]
    outcomes = [run(hub.call(spec, {"a": 1, "b": 1}, 10)) for spec in adds]

    assert [(spec.server, spec.function_name) for spec in adds] == [("left", "left_add"), ("right", "right_add")]
    assert len({spec.function_name for spec in specs}) == len(specs) == 8
    assert [outcome.text for outcome in outcomes] == ["2", "2"]


def test_function_names_follow_openai_rules_and_stay_distinct():
    names = function_names([("a", "search"), ("b", "search"), ("c", "read file!"), ("d", "a_search"), ("e", "x" * 80)])

    assert names == ("a_search", "b_search", "read_file_", "a_search_2", "x" * 64)


def test_always_allow_is_saved_in_the_servers_settings(hub, holder, numbers, run, tmp_path):
    holder.update(tool_servers=(numbers,))
    add = _named(run(hub.tools()), "add")
    assert not hub.always_allowed(add)

    hub.allow_always(add)

    assert hub.always_allowed(add)
    assert load_settings(tmp_path / "settings.json").settings.tool_servers[0].always_allowed == ("add",)
    assert ToolHub(SettingsHolder(tmp_path / "settings.json")).always_allowed(add)


def test_turning_a_server_off_stops_it_and_hides_its_tools(hub, holder, numbers, pid_file, run, qtbot):
    holder.update(tool_servers=(numbers,))
    assert run(hub.tools())

    holder.update(tool_servers=(replace(numbers, enabled=False),))

    assert run(hub.tools()) == ()
    (pid,) = started_pids(pid_file)
    qtbot.waitUntil(lambda: not is_running(pid), timeout=30_000)


def test_close_stops_every_server(holder, pid_file, run):
    hub = ToolHub(holder)
    holder.update(tool_servers=(server_config("left", pid_file), server_config("right", pid_file)))
    run(hub.tools())

    run(hub.close())

    pids = started_pids(pid_file)
    assert len(pids) == 2 and not any(is_running(pid) for pid in pids)

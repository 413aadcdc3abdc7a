"""The hub inside the app as ``app.main`` runs it: qasync's own loop, and quitting stops the servers."""

from __future__ import annotations

from .conftest import is_running, started_pids


def test_the_hub_calls_tools_under_the_apps_loop_and_quitting_stops_its_server(real_app, numbers, pid_file):
    outcomes = {}

    async def scenario(window) -> None:
        window.settings_holder.update(tool_servers=(numbers,))
        specs = {spec.name: spec for spec in await window.tool_hub.tools()}
        outcomes["add"] = await window.tool_hub.call(specs["add"], {"a": 20, "b": 22}, 30)
        outcomes["hung"] = await window.tool_hub.call(specs["sleep_forever"], {}, 1)
        outcomes["again"] = await window.tool_hub.call(specs["add"], {"a": 1, "b": 2}, 30)

    real_app.run(scenario)

    assert (outcomes["add"].status, outcomes["add"].text) == ("done", "42")
    assert outcomes["hung"].status == "timeout" and outcomes["hung"].seconds < 6
    assert (outcomes["again"].status, outcomes["again"].text) == ("done", "3")
    pids = started_pids(pid_file)
    assert len(pids) == 2 and not any(is_running(pid) for pid in pids)

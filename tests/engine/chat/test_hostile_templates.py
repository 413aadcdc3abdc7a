"""Hostile chat templates are stopped within a bounded time and memory, and the engine carries on."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from engine.chat.chat_template import SAMPLE_CHAT, ChatTemplate, ChatTemplateError
from engine.chat.template_sandbox import MEMORY_LIMIT_BYTES, limit_memory
from engine.models.model_files import inspect_model
from engine.protocol.messages import ChatMessage, LoadFailed, ModelLoaded

GOOD_TEMPLATE = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}"
SLOW = "took too long to render"
GREEDY = "took too much memory to render"
SLOW_OR_GREEDY = "took too (long|much memory) to render"  # which limit comes first depends on the machine
LOOPS = "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}"
HOSTILE = {
    "nested range loops": (LOOPS, SLOW),
    "tojson's huge indent": ("{{ messages|tojson(indent=1000000000) }}", "sandbox blocks"),
    "a %-format width": ("{{ '%2000000000d' % 1 }}", GREEDY),
    "a str.format width": ("{{ '{:>2000000000}'.format('x') }}", GREEDY),
    "a string doubled with ~": (
        "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
        GREEDY,
    ),
    "lipsum of 10^8 paragraphs": ("{{ lipsum(n=100000000) }}", SLOW_OR_GREEDY),
}


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_template_is_stopped_and_the_next_render_works(name: str) -> None:
    source, reason = HOSTILE[name]
    started = time.monotonic()
    with pytest.raises(ChatTemplateError, match=reason) as refused:
        ChatTemplate(source, "evil.gguf").render(SAMPLE_CHAT)
    assert time.monotonic() - started < 10
    assert "evil.gguf" in str(refused.value)
    assert ChatTemplate(GOOD_TEMPLATE).render(SAMPLE_CHAT[:1]) == "<|user|>Hello!"


def test_renderer_process_stays_within_its_memory_cap() -> None:
    """Run in a fresh process whose only child is the renderer, so RUSAGE_CHILDREN is the renderer's peak."""
    script = (
        "import resource\n"
        "from engine.chat.chat_template import SAMPLE_CHAT, ChatTemplate, ChatTemplateError\n"
        "from engine.chat.template_renderer import RENDERER\n"
        f"source = {HOSTILE['a string doubled with ~'][0]!r}\n"
        "try:\n"
        "    ChatTemplate(source).render(SAMPLE_CHAT)\n"
        "except ChatTemplateError as error:\n"
        "    print(error)\n"
        "RENDERER.close()\n"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)\n"
    )
    root = str(Path(__file__).resolve().parents[3])
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PYTHONPATH": root}, check=True)
    message, peak_bytes = result.stdout.strip().splitlines()
    assert GREEDY in message
    assert int(peak_bytes) <= MEMORY_LIMIT_BYTES


def test_model_with_hostile_template_is_refused_when_opened(model_with_template) -> None:
    path = model_with_template(HOSTILE["nested range loops"][0])
    started = time.monotonic()
    with pytest.raises(ChatTemplateError, match=SLOW):
        ChatTemplate.for_model(inspect_model(path))
    assert time.monotonic() - started < 10


def test_template_that_refuses_the_sample_chat_still_opens(model_with_template) -> None:
    path = model_with_template("{{ raise_exception('Only user roles') }}")
    assert not ChatTemplate.for_model(inspect_model(path)).is_fallback


def test_rendering_adds_well_under_a_millisecond() -> None:
    template = ChatTemplate(GOOD_TEMPLATE)
    template.render(SAMPLE_CHAT)
    started = time.perf_counter()
    for _ in range(100):
        template.render(SAMPLE_CHAT)
    assert (time.perf_counter() - started) / 100 < 0.005


@pytest.fixture
def model_with_template(tiny_model_dir: Path, tmp_path: Path) -> Callable[[str], Path]:
    """A copy of the tiny model whose chat_template.jinja is the given text."""
    def make(template: str) -> Path:
        folder = Path(shutil.copytree(tiny_model_dir, tmp_path / f"model-{len(list(tmp_path.iterdir()))}"))
        (folder / "chat_template.jinja").write_text(template)
        return folder
    return make


def test_engine_refuses_a_hostile_template_and_answers_the_next_request(engine_driver, model_with_template) -> None:
    boom_model = model_with_template(  # loops forever only when the last message says "boom"
        "{% if 'boom' in messages[-1].content %}" + LOOPS + "{% endif %}"
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "<|im_start|>assistant\n"
    )
    engine = engine_driver()
    try:
        refused = engine.load(str(model_with_template(HOSTILE["lipsum of 10^8 paragraphs"][0])))
        assert isinstance(refused, LoadFailed) and re.search(SLOW_OR_GREEDY, refused.message)
        assert isinstance(engine.load(str(boom_model)), ModelLoaded)
        started = time.monotonic()
        with pytest.raises(AssertionError, match=SLOW):
            engine.ask("c1", [ChatMessage("user", "boom")])
        assert time.monotonic() - started < 10
        assert engine.ask("c1", [ChatMessage("user", "Hello")]).reply.text
    finally:
        engine.thread.stop()


def test_without_resource_the_renderer_runs_on_its_deadline_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on Windows: no address-space cap can be set, and that is no error."""
    monkeypatch.setitem(sys.modules, "resource", None)  # makes ``import resource`` raise ImportError
    limit_memory(MEMORY_LIMIT_BYTES)

"""GUI-stall benchmark: ``python -m app.perf.bench.gui --json`` (GUI thread, offscreen by default).

Streams ``--tokens`` tokens at ``--rate`` tokens/s from a fake engine into a real window (with
Markdown and a code block, as a model writes), then streams ``--together`` replies of half as
many tokens at once into as many conversations (the fake engine writes them in turn, at
``--rate`` in all) while switching from one to the next every ``TOGETHER_SWITCH_S``, then
opens a ``--messages``-message conversation (short and medium replies, and every ninth a
long one of ~12 000 characters with code), scrolls it up to its first message and down
again, and switches between it and another as long a few times. A 2 ms QTimer records the gaps between event-loop ticks; a
gap is the longest time the window could not react. One JSON line per phase with the longest
and the 99th-percentile gap in ms. Data goes to a temporary HEARTH_HOME.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time

TICK_MS = 2
FRAME_S = 0.016
SETTLE_S = 0.3
SWITCHES = 6
SCROLL_LIMIT_S = 60.0
TOGETHER_SWITCH_S = 0.25
STREAM_PROMPT = "Stream, please"


class StallMeter:
    """Records the gaps between ticks of a fast QTimer while it runs."""

    def __init__(self) -> None:
        from PySide6.QtCore import QTimer

        self.gaps_ms: list[float] = []
        self._last = time.perf_counter()
        self._timer = QTimer()
        self._timer.setInterval(TICK_MS)
        self._timer.timeout.connect(self._tick)

    def start(self) -> None:
        self.gaps_ms.clear()
        self._last = time.perf_counter()
        self._timer.start()

    def stop(self) -> dict[str, float]:
        self._timer.stop()
        gaps = sorted(self.gaps_ms) or [0.0]
        return {"max_stall_ms": round(gaps[-1], 1), "p99_stall_ms": round(gaps[int(len(gaps) * 0.99)], 1), "ticks": len(gaps)}

    def _tick(self) -> None:
        now = time.perf_counter()
        self.gaps_ms.append((now - self._last) * 1000)
        self._last = now


def streaming_runtime(tokens: int, rate: float):
    """A fake runtime that writes ``tokens`` tokens of Markdown with a code block at ``rate`` per second."""
    from engine.protocol.messages import Generate, LoadModel, ModelLoaded, ReplyFinished, RequestStats, TokenStreamed
    from engine.service.worker import ServesWhole

    prose = ["Here ", "is ", "**some** ", "text ", "that ", "a ", "model ", "writes.\n\n"] * 6
    pieces = prose + ["```python\n", "def f(x):\n", "    return x\n", "```\n\n"]

    class Runtime(ServesWhole):
        def __init__(self, emit, watch) -> None:
            self._emit = emit
            self._watch = watch

        def handle(self, request) -> None:
            if isinstance(request, LoadModel):
                self._emit(ModelLoaded(request.request_id, "Bench", request.path, "cpu", "fp32", 4096, 0.0))
            elif isinstance(request, Generate):
                self._stream(request)

        def _stream(self, first) -> None:
            """One token every 1/``rate`` s, to each running reply in turn; Generates that arrive meanwhile join in."""
            texts: dict[str, list[str]] = {}
            lengths: dict[str, int] = {}
            self._join(first, texts, lengths)
            started, step = time.perf_counter(), 0
            while texts:
                for request_id in list(texts):
                    time.sleep(max(0.0, started + step / rate - time.perf_counter()))
                    step += 1
                    self._token(request_id, texts, lengths)
                arrived = self._watch.next_request(timeout=0)
                if isinstance(arrived, Generate):
                    self._join(arrived, texts, lengths)

        @staticmethod
        def _join(request, texts: dict[str, list[str]], lengths: dict[str, int]) -> None:
            texts[request.request_id] = []
            lengths[request.request_id] = tokens if request.messages[-1].content == STREAM_PROMPT else tokens // 2

        def _token(self, request_id: str, texts: dict[str, list[str]], lengths: dict[str, int]) -> None:
            text = texts[request_id]
            piece = pieces[len(text) % len(pieces)]
            text.append(piece)
            self._emit(TokenStreamed(request_id, piece, len(text), rate, time.time()))
            if len(text) == lengths[request_id]:
                del texts[request_id]
                self._emit(ReplyFinished(request_id, "".join(text), RequestStats(tokens_generated=len(text))))

        def idle(self) -> None:
            """Nothing to sample."""

        def close(self) -> None:
            """Nothing to release."""

    return Runtime


def paragraph(index: int, number: int) -> str:
    """About 600 characters of prose with some inline Markdown, different for each reply."""
    sentence = (
        f"In step {index}, part {number} of the answer explains how the *state* is kept and why the "
        f"`cache_{number}` lookup stays cheap, even when the input grows to {index * 37 + number} items. "
    )
    return sentence * 3 + f"This is what makes **part {number}** of step {index} work."


def code_block(index: int, lines: int) -> str:
    body = "\n".join(f"    total_{line} = compute(step={index}, line={line}, scale={line * 3})  # line {line}" for line in range(lines))
    return f"```python\ndef step_{index}(items):\n{body}\n    return total_0\n```"


def long_reply(index: int) -> str:
    """A long reply as models write them (~12 000 characters): prose, two code blocks, lists."""
    parts = [paragraph(index, number) for number in range(8)] + [code_block(index, 40)]
    parts += [paragraph(index, number) for number in range(8, 14)] + [code_block(index + 1, 12)]
    parts += ["\n".join(f"- Point {point} of step {index}: keep the `{point}` case in mind." for point in range(10))]
    parts += ["\n".join(f"{point}. Then do part {point} of step {index} again." for point in range(1, 8))]
    return "\n\n".join(parts + [paragraph(index, 14)])


def stored_reply(index: int) -> str:
    """Every ninth reply is long, every third a few paragraphs with code, the others a short answer."""
    if index % 9 == 4:
        return long_reply(index)
    if index % 3 == 1:
        return "\n\n".join([paragraph(index, 0), code_block(index, 6), paragraph(index, 1)])
    return f"Step **{index}** works like this:\n\n```python\nstep({index})\n```\n"


def long_conversation(journal, count: int) -> str:
    """Store a conversation of ``count`` messages (user and assistant alternating); return its id."""
    from app.conversations.conversation import Conversation

    conversation = Conversation()
    for index in range(count // 2):
        journal.add_user_message(conversation, f"Question {index}: how does step {index} work?")
        reply = journal.begin_reply(conversation)
        reply.content, reply.state = stored_reply(index), "done"
        journal.finish_reply(reply)
    return conversation.id


async def run(args: argparse.Namespace) -> list[dict[str, object]]:
    from app.controller import EngineController
    from app.main import quiet_collector
    from app.window.main_window import MainWindow
    from engine.service.client import AsyncEngine

    controller = EngineController()
    window = MainWindow(controller)
    window.resize(1100, 800)
    window.show()
    collector = quiet_collector(controller, window)  # as app.main does at start-up
    controller.start(AsyncEngine(streaming_runtime(args.tokens, args.rate)))
    window.session.load_model("bench")
    while not window.session.send(STREAM_PROMPT):
        await asyncio.sleep(0.01)
    meter, results = StallMeter(), []
    meter.start()
    while window.session.generating:
        await asyncio.sleep(0.01)
    results.append({"phase": "stream", "tokens": args.tokens, "rate_tok_s": args.rate, **meter.stop()})
    together = {"phase": "together", "replies": args.together, "tokens": args.tokens // 2, "rate_tok_s": args.rate}
    results.append({**together, **await stream_together(window, meter, args.together)})
    first = long_conversation(window.journal, args.messages)
    second = long_conversation(window.journal, args.messages)
    meter.start()
    window.conversations.open(first)
    await settle(window)
    results.append({"phase": "open", "messages": args.messages, **meter.stop()})
    results.append({"phase": "scroll", "messages": args.messages, **await scroll(window, meter, args.messages)})
    results.append({"phase": "switch", "messages": args.messages, **await switch(window, meter, (second, first))})
    controller.close()
    collector.stop()
    return results


async def stream_together(window, meter: StallMeter, count: int) -> dict[str, float]:
    """Ask in ``count`` new conversations at once, then switch to the next answering one until all are done."""
    meter.start()
    for index in range(count):
        window.conversations.new_conversation()
        window.session.send(f"Stream {index} beside the others, please")
    switches = 0
    while answering := sorted(window.session.replies.answering):
        window.conversations.open(answering[switches % len(answering)])
        switches += 1
        await asyncio.sleep(TOGETHER_SWITCH_S)
    return {**meter.stop(), "switches": switches}


async def settle(window) -> None:
    """Wait until the view made its cards, and a little longer for what follows (layout, painting)."""
    while window.chat_view.loading:
        await asyncio.sleep(0.005)
    await asyncio.sleep(SETTLE_S)


async def scroll(window, meter: StallMeter, messages: int) -> dict[str, float]:
    """Scroll up to the first message, half a page a frame (older cards made on the way), then down to the last."""
    view = window.chat_view
    bar = view.verticalScrollBar()
    deadline = time.perf_counter() + SCROLL_LIMIT_S
    meter.start()
    while (bar.value() > 0 or view.loading or len(view.bubbles) < messages) and time.perf_counter() < deadline:
        bar.setValue(bar.value() - bar.pageStep() // 2)
        await asyncio.sleep(FRAME_S)
    while bar.value() < bar.maximum():
        bar.setValue(bar.value() + bar.pageStep() // 2)
        await asyncio.sleep(FRAME_S)
    return {**meter.stop(), "cards": len(view.bubbles)}


async def switch(window, meter: StallMeter, conversation_ids: tuple[str, str]) -> dict[str, float]:
    """Switch back and forth between two long conversations (the one shown was scrolled through)."""
    meter.start()
    for turn in range(SWITCHES):
        window.conversations.open(conversation_ids[turn % 2])
        await settle(window)
    return meter.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print JSON lines (the default output is the same)")
    parser.add_argument("--rate", type=float, default=500.0)
    parser.add_argument("--tokens", type=int, default=2000)
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--together", type=int, default=3, help="replies streaming at once in the second phase")
    args = parser.parse_args()
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    os.environ["HEARTH_HOME"] = tempfile.mkdtemp(prefix="hearth-bench-")
    import qasync
    from PySide6.QtWidgets import QApplication

    application = QApplication([])
    for result in qasync.run(run(args)):
        print(json.dumps(result))
    application.processEvents()


if __name__ == "__main__":
    main()

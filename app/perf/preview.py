"""Render the performance panel, fed a realistic scripted session, to a PNG.

    python -m app.perf.preview OUT.png [WIDTH]

Runs on the GUI thread of its own offscreen QApplication. The events are made
up here (two replies on a GPU, the second reusing the cached history, while a
batching engine runs it beside other conversations' replies) so the
panel's look can be reviewed without a model; the README screenshot comes
from the real app.
"""

from __future__ import annotations

import os
import random
import sys

from PySide6.QtWidgets import QApplication

from app.perf.panel import PerformancePanel
from engine.protocol.messages import (
    BatchSampled,
    Event,
    KVPoolStats,
    MemorySampled,
    MemoryStats,
    ModelLoaded,
    PrefillDone,
    ReplyFinished,
    RequestStats,
    TokenStreamed,
)

GIB = 1024**3
MIB = 1024**2
DEFAULT_WIDTH = 440


def _memory(kv_conversation: int, kv_total: int, rss: int) -> MemoryStats:
    used = int(3.1 * GIB) + kv_total
    total = 24 * GIB
    return MemoryStats("cuda", int(2.9 * GIB), kv_conversation, kv_total, used, total - used, total, rss)


def _reply(request_id: str, start: float, prompt: int, reused: int, count: int, rng: random.Random) -> list[Event]:
    tokenize_ms, prefill_ms = 3.8, 0.11 * (prompt - reused) + 6
    first_token_at = start + (tokenize_ms + prefill_ms + 9) / 1000
    events: list[Event] = [PrefillDone(request_id, tokenize_ms, prompt, reused, prefill_ms, 32768)]
    now = first_token_at
    for index in range(1, count + 1):
        speed = 48 + 4 * rng.random() - index * 0.01
        now += 1 / speed if index > 1 else 0.0
        events.append(TokenStreamed(request_id, "·", index, speed, now))
    decode_ms = (now - first_token_at) * 1000
    kv = (prompt + count) * 28 * 1024
    stats = RequestStats(
        tokenize_ms, prompt, reused, prefill_ms, (first_token_at - start) * 1000, decode_ms,
        (count - 1) / (decode_ms / 1000), count, "eos", 32768, (),
        _memory(kv, kv + 40 * MIB, int(1.4 * GIB)), start, now,
    )
    events.append(ReplyFinished(request_id, "…", stats))
    return events


def _batch_samples(start: float, end: float, rng: random.Random) -> list[Event]:
    """What a batching engine reports four times a second: three replies running, one waiting."""
    samples: list[Event] = []
    for step in range(int((end - start) * 4)):
        used = 180 + step // 8
        pool = KVPoolStats(16, 2048, used, 74, 60, 16 * 28 * 1024)
        samples.append(BatchSampled(3, 1, 128 + 8 * rng.random(), pool, start + step / 4))
    return samples


def scripted_session(seed: int = 7) -> list[Event]:
    """A model load, memory samples over two and a half minutes, then two replies (the second reuses)."""
    rng = random.Random(seed)
    events: list[Event] = [ModelLoaded("r0", "Qwen2.5-1.5B-Instruct", "/models/qwen", "cuda", "bf16", 32768, 6.2, _memory(0, 0, int(1.2 * GIB)))]
    for second in range(146):
        rss = int(1.2 * GIB + min(second, 120) * 1.6 * MIB)
        kv = 0 if second < 60 else 22 * MIB if second < 130 else 62 * MIB
        events.append(MemorySampled(_memory(kv, kv + 40 * MIB, rss), 1000.0 + second))
    events += _reply("r1", 1088.0, 812, 0, 480, rng)
    events += _reply("r2", 1121.0, 1318, 1190, 700, rng)
    return events + _batch_samples(1100.0, 1135.0, rng)


def render_preview(path: str, width: int = DEFAULT_WIDTH) -> None:
    """Feed ``scripted_session`` to a panel and save it as a PNG at ``path``."""
    panel = PerformancePanel()
    for event in scripted_session():
        panel.on_event(event)
    panel.refresh()
    height = panel.heightForWidth(width)
    panel.resize(width, height if height > 0 else panel.sizeHint().height())
    if not panel.grab().save(path):
        raise OSError(f"could not write the preview image to {path}")


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    app = QApplication.instance() or QApplication([])
    render_preview(argv[1], int(argv[2]) if len(argv) == 3 else DEFAULT_WIDTH)
    app.processEvents()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

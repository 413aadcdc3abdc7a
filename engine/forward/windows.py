"""Which layers attend over a sliding window, and how layers share the block pool's pages (any thread; no torch).

``layer_windows`` reads a model's config as transformers does: a layer with window ``w``
lets the query at position ``p`` see the keys at ``p - w + 1 … p`` (transformers'
``sliding_window_overlay``: ``kv_idx > q_idx - w``), a full layer every key up to ``p``.

``KVGroups`` splits the layers into KV groups the way vLLM's hybrid allocator does
(``kv_cache_coordinator``): layers of one kind (full attention, or one window) in
groups of ``page_layers`` layers, so that a block of the pool holds one group's
keys and values for ``block_size`` positions whatever the group. Each group has
its own block table per sequence (``engine/scheduler``); a window group lets go of
the blocks that fall wholly before its window as the sequence grows. A model whose
layers are all of one kind has one group of all its layers: one table, as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SLIDING, FULL = "sliding_attention", "full_attention"
WINDOW_OFF_BY_DEFAULT = ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe")  # configs whose ``use_sliding_window`` is False
FULL_EVERY = {"gemma2": 2, "gpt_oss": 2, "gemma3": 6, "gemma3_text": 6}
"""Without ``layer_types`` transformers makes every n-th layer of these full attention (Gemma 3's n is its config's
``sliding_window_pattern`` where given): what a config.json read without transformers needs to know."""


def layer_windows(config: Any) -> tuple[int | None, ...]:
    """Each layer's window in tokens, ``None`` for full attention. As transformers 5 decides: no window where
    ``sliding_window`` is unset or ``use_sliding_window`` is false (Qwen2/Qwen3); else ``layer_types`` names the
    windowed layers, except for Mistral, whose model windows every layer whatever it says; without ``layer_types``
    the pattern of ``FULL_EVERY``'s families, else the layers from ``max_window_layers`` on (Qwen2/Qwen3; 0
    elsewhere: all of them)."""
    count = config.num_hidden_layers
    window = getattr(config, "sliding_window", None)
    model_type = getattr(config, "model_type", None)
    if not window or not getattr(config, "use_sliding_window", model_type not in WINDOW_OFF_BY_DEFAULT):
        return (None,) * count
    types = getattr(config, "layer_types", None)
    if types is None and model_type in FULL_EVERY:
        every = getattr(config, "sliding_window_pattern", None) or FULL_EVERY[model_type]
        types = [SLIDING if (index + 1) % every else FULL for index in range(count)]
    if types is None or model_type == "mistral":
        first = getattr(config, "max_window_layers", 0) or 0
        types = [SLIDING if index >= first else FULL for index in range(count)]
    return tuple(int(window) if kind == SLIDING else None for kind in types)


@dataclass(frozen=True)
class KVGroups:
    """``layers[g]``: the model's layer indices whose keys and values group ``g`` holds; ``windows[g]``: their
    window (``None``: full attention). Group 0 comes first of the full groups where there are any: its table
    carries the prefix index (``Scheduler``)."""

    layers: tuple[tuple[int, ...], ...]
    windows: tuple[int | None, ...]

    @staticmethod
    def of(windows: tuple[int | None, ...]) -> KVGroups:
        """Layers of one window (or of full attention) in groups of as many layers as the smallest kind has, the
        last group of a kind taking what is left (vLLM's grouping: a page fits every group)."""
        kinds: dict[int | None, list[int]] = {}
        for index, window in enumerate(windows):
            kinds.setdefault(window, []).append(index)
        ordered = sorted(kinds.items(), key=lambda kind: kind[0] is not None)  # full attention first
        size = min(len(layers) for _, layers in ordered)
        groups = [(window, tuple(layers[i : i + size]))
                  for window, layers in ordered for i in range(0, len(layers), size)]
        return KVGroups(tuple(layers for _, layers in groups), tuple(window for window, _ in groups))

    @property
    def page_layers(self) -> int:
        """Layers a block of the pool holds: the largest group's."""
        return max(len(layers) for layers in self.layers)

    def place(self, layer: int) -> tuple[int, int]:
        """Layer ``layer``'s group and its index among the page's layers."""
        for group, layers in enumerate(self.layers):
            if layer in layers:
                return group, layers.index(layer)
        raise IndexError(f"no layer {layer}")


def window_start(position: int, window: int | None) -> int:
    """The first position the query at ``position`` sees under ``window`` (0 for full attention)."""
    return 0 if window is None else max(0, position - window + 1)

"""``nn.Module``s that hold a transformers model's layers in the fast path's packed formats (engine thread).

The quantized transformers fallback (``engine.models.quantized_fallback``) builds a model transformers knows and
the fast path does not, and swaps its modules for these as each weight is read: every ``nn.Linear`` becomes a
``PackedLinear`` on the fast path's own ``quant.Linear`` (int4 groups of 32 on Hearth's kernel, int8, or the output
layer's format), every ``nn.Embedding`` a ``TableEmbedding`` in bf16. transformers' own forward calls them like the
modules they replace; activations stay fp32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.forward.weights.quant import Linear
from engine.forward.weights.quant_int import Int4Groups, rows_at_once
from engine.forward.weights.row_chunks import RowChunks

TABLE_DTYPE = torch.bfloat16  # a token table's storage: half fp32's bytes, widened exactly on lookup


class PackedLinear(nn.Module):
    """``y = x @ W.T + b`` with ``W`` [N, K] packed in ``fmt`` (``quant.Linear``); ``b`` [N] stays an fp32 parameter.

    ``nbytes``: what the packed weight holds (the bias is a parameter, counted with the model's). ``bias`` may be
    set after construction, when a file holds it after the weight. ``weight`` may come as a GGUF file's 4-bit groups
    (``Int4Groups``) or, for the output layer's int8 or two int4 planes, as ``RowChunks``, packed a few rows at a time.
    """

    def __init__(self, weight: torch.Tensor | Int4Groups | RowChunks, fmt: str, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        rows, width = weight.shape
        self.in_features, self.out_features, self.fmt = width, rows, fmt
        self._linear = Linear(weight.float() if isinstance(weight, torch.Tensor) else weight, None, fmt)
        self.nbytes = self._linear.nbytes
        self.bias = None if bias is None else nn.Parameter(bias.float(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).float().contiguous()  # [M, K]
        out = self._linear(rows)  # [M, N]
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features).to(x.dtype)  # [..., N]

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, fmt={self.fmt}"


class TableEmbedding(nn.Module):
    """Token id → hidden vector from a table [V, D] kept in bf16 (``TABLE_DTYPE``), looked up in fp32.

    The table is a buffer named ``weight``, where transformers' code looks for an embedding's table. It may come as
    ``RowChunks`` (a GGUF file's blocks), converted a few rows at a time.
    """

    def __init__(self, table: torch.Tensor | RowChunks, padding_idx: int | None = None) -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim = table.shape
        self.padding_idx = padding_idx
        self.register_buffer("weight", _in_table_dtype(table))  # [V, D]

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(token_ids, self.weight).float()  # [..., D]


def _in_table_dtype(table: torch.Tensor | RowChunks) -> torch.Tensor:
    """``table`` [V, D] in ``TABLE_DTYPE``; ``RowChunks`` decoded ``rows_at_once`` rows at a time, never whole in fp32."""
    if isinstance(table, torch.Tensor):
        return table.to(TABLE_DTYPE).contiguous()
    rows, width = table.shape
    kept = torch.empty(rows, width, dtype=TABLE_DTYPE)
    step = rows_at_once(width)
    for start in range(0, rows, step):
        kept[start : start + step] = table[start : min(rows, start + step)]
    return kept

"""Decode attention over block tables: the Triton kernel (in Triton's interpreter) and its torch twin equal ``attend``
over each sequence's gathered keys."""

from __future__ import annotations


import pytest
import torch

from engine.forward.attention import attend
from engine.forward.paged_attention import gathered_decode_attention, split_count
from engine.forward.paged_kv import BatchRow, PagedKV
from tests.engine.forward.triton_interpreter import assert_passes_in_the_interpreter

BLOCK = 4
LENGTHS = (1, 7, 37, 70)
TABLES = ([5], [9, 2], [30, 1, 17, 3, 4, 8, 10, 11, 12, 13], list(range(39, 21, -1)))  # scattered, reversed


def case(kv_heads: int, groups: int, head_dim: int, seed: int = 0):
    """A pool (one layer) of random keys and values, rows' queries and tables; and ``attend`` over gathered keys."""
    torch.manual_seed(seed)
    kv = PagedKV(1, kv_heads, head_dim, 40, BLOCK, torch.float32, torch.device("cpu"))
    kv.buffer.normal_()
    q = torch.randn(len(LENGTHS), kv_heads * groups, head_dim)  # [B, H, hd]
    tables = torch.zeros(len(LENGTHS), 18, dtype=torch.long)  # [B, W]: unused entries point at block 0
    for index, table in enumerate(TABLES):
        tables[index, : len(table)] = torch.tensor(table)
    layout = kv.layout([BatchRow([0] * n, 0, table) for n, table in zip(LENGTHS, TABLES)])
    expected = torch.cat([attend(q[i : i + 1], *kv.read(0, span.runs), torch.zeros(1, n))  # [1, n]: sees all n
                          for i, (span, n) in enumerate(zip(layout.spans, LENGTHS))])
    return q, kv.buffer[0], tables, torch.tensor(LENGTHS), expected


@pytest.mark.parametrize("kv_heads, groups, head_dim", [(2, 3, 16), (1, 1, 8), (4, 2, 20)])
def test_gathered_decode_attention_equals_attend_over_gathered_keys(kv_heads, groups, head_dim):
    q, layer_kv, tables, lengths, expected = case(kv_heads, groups, head_dim)
    got = gathered_decode_attention(q, layer_kv, tables, lengths, BLOCK)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_positions_no_row_has_written_may_hold_anything():
    """A fresh pool is uninitialised memory: NaN there, past each row's length, must not reach any row."""
    q, layer_kv, tables, lengths, expected = case(2, 3, 16)
    written = torch.zeros(layer_kv.shape[2], dtype=torch.bool)  # [P]
    for length, table in zip(LENGTHS, TABLES):
        for position in range(length):
            written[table[position // BLOCK] * BLOCK + position % BLOCK] = True
    layer_kv[:, :, ~written] = float("nan")
    got = gathered_decode_attention(q, layer_kv, tables, lengths, BLOCK)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_split_count_fills_the_gpu_up_to_a_limit():
    assert split_count(1, 8) == 16 and split_count(4, 8) == 8 and split_count(32, 8) == 1


def test_triton_paged_attention_kernel_matches_attend_in_the_interpreter():
    """Several splits and tiles per row, G query heads padded to 16, a head size that is not a power of two."""
    script = (
        "import torch\n"
        "from engine.forward.paged_attention import paged_decode_attention\n"
        "from tests.engine.forward.test_paged_attention import BLOCK, case\n"
        "for kv_heads, groups, head_dim in ((2, 3, 16), (1, 1, 8), (4, 2, 20)):\n"
        "    q, layer_kv, tables, lengths, expected = case(kv_heads, groups, head_dim)\n"
        "    for splits, tile in ((1, 16), (3, 16), (None, 64)):\n"
        "        got = paged_decode_attention(q, layer_kv, tables, lengths, BLOCK, splits, tile)\n"
        "        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)\n"
        "print('ok')\n"
    )
    assert_passes_in_the_interpreter(script)


@pytest.mark.gpu
def test_the_kernel_on_a_gpu_in_bf16_stays_near_attend():
    from engine.forward.paged_attention import paged_decode_attention

    q, layer_kv, tables, lengths, expected = case(8, 4, 128)
    on_gpu = [t.cuda() for t in (q.bfloat16(), layer_kv.bfloat16(), tables, lengths)]
    got = paged_decode_attention(*on_gpu, BLOCK)
    torch.testing.assert_close(got.float().cpu(), expected, rtol=3e-2, atol=3e-2)

"""Packing fp16 weights on a worker beside the load gives the same layers, and a failure still surfaces."""

from __future__ import annotations

import threading

import pytest
import torch

from engine.forward.weights.pack_worker import PackWorker
from engine.forward.weights.quant import Linear


def test_layers_packed_on_the_worker_match_those_packed_at_once():
    torch.manual_seed(0)
    first, second, bias = torch.randn(96, 640), torch.randn(64, 96), torch.randn(64)  # 640: a short last block
    x = torch.randn(3, 640)
    with PackWorker() as worker:
        on_worker = (Linear(first, None, "fp16", one_row_fmt="int4", worker=worker),
                     Linear(second, bias, "fp16", worker=worker))
    at_once = (Linear(first, None, "fp16", one_row_fmt="int4"), Linear(second, bias, "fp16"))
    assert torch.equal(on_worker[1](on_worker[0](x)), at_once[1](at_once[0](x)))  # many rows: the fp16 copy
    assert torch.equal(on_worker[0](x[:1]), at_once[0](x[:1]))  # one row: the 4-bit copy


def test_at_most_pending_weights_wait_for_the_worker():
    release = threading.Event()
    handed = []

    def slow(index: int) -> int:
        release.wait()
        return index

    with PackWorker(pending=2) as worker:
        thread = threading.Thread(target=lambda: handed.extend(worker.pack(slow, i) for i in range(3)))
        thread.start()
        thread.join(timeout=0.5)
        assert thread.is_alive()  # the third waits while two are in the worker's hands
        release.set()
        thread.join(timeout=5)
    assert [packed.value for packed in handed] == [0, 1, 2]


def test_a_packing_failure_is_raised_when_the_block_is_left():
    def fails() -> None:
        raise MemoryError("no room for the packed weight")

    with pytest.raises(MemoryError, match="no room"):
        with PackWorker() as worker:
            worker.pack(fails)

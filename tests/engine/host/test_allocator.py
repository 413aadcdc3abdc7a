"""How the engine's process holds memory (``allocator``): large buffers in huge pages where Linux grants them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")
# A fresh process: sets the engine's memory up, fills a 64 MiB buffer and prints its huge pages in KiB.
FILL = """
from engine.host.allocator import set_up_process_memory
set_up_process_memory()
import torch
buffer = torch.ones(64 * 1024 * 1024, dtype=torch.uint8)
own = open("/proc/self/smaps_rollup").read().split("AnonHugePages:")[1].split()[0]
print(own)
"""


def _huge_kib(environment: dict[str, str]) -> int:
    result = subprocess.run([sys.executable, "-c", FILL], capture_output=True, text=True, cwd=REPO, check=True,
                            env={**environment, "PYTHONPATH": str(REPO)}, timeout=120)
    return int(result.stdout.strip())


@pytest.mark.skipif(not THP_SETTING.exists() or "[never]" in THP_SETTING.read_text(),
                    reason="Linux grants no transparent huge pages here")
def test_a_large_buffer_lies_in_huge_pages_unless_the_environment_says_otherwise():
    environment = {name: value for name, value in os.environ.items() if name != "THP_MEM_ALLOC_ENABLE"}
    assert _huge_kib(environment) >= 32 * 1024  # most of its 64 MiB (the ends may not fill a 2 MiB page)
    assert _huge_kib({**environment, "THP_MEM_ALLOC_ENABLE": "0"}) < 32 * 1024

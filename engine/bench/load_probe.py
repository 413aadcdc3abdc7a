"""One load of a model in a fresh process, measured from the OS (main thread of that process, and its parent).

``python -m engine.bench.load_probe MODEL [--quant Q] [--cycles N] [--device D]`` loads ``MODEL``
through ``open_model`` in precision ``Q`` on device ``D`` (``auto`` unless given; ``--cycles`` times, each after dropping the last, printing the
memory of each when N > 1), then feeds a short prompt (through the batch runner, or a transformers model's own
cache), and prints its figures as
the last JSON line: ``load_s``, ``weight_bytes``, the memory estimate of a model file in the formats it loaded in
(``estimate_weight_bytes``, ``estimate_kv_bytes`` for its context, ``estimate_total_bytes`` with the overhead), the whole process's resident size
once loaded (``rss_after_load_bytes``), its peak (``VmHWM``) after the load and after the prompt, and
``disk_bytes_written`` (``write_bytes`` of ``/proc/self/io``: a GGUF file
converted into the cache shows here). ``run_load_probe`` runs it from the
benchmark, optionally under an address-space limit, as ``prlimit --as`` does.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from engine.host.memory import peak_rss_bytes

PROBE_IDS = list(range(16))  # a short prompt that any vocabulary holds


def disk_bytes_written() -> int:
    """Bytes this process caused to be written to storage, from ``/proc/self/io`` (0 where /proc is missing)."""
    try:
        with open("/proc/self/io") as io:
            return next(int(line.split()[1]) for line in io if line.startswith("write_bytes:"))
    except (OSError, StopIteration):
        return 0


def probe(model: str, quant: str, cycles: int, device: str) -> dict[str, Any]:
    import torch

    from engine.bench.bench_models import open_bench_model
    from engine.bench.measure import measure_prefill_ms
    from engine.forward.backend import HFBackend
    from engine.host.allocator import set_up_process_memory
    from engine.host.memory import read_memory

    torch.set_grad_enabled(False)
    set_up_process_memory()
    loaded = None
    for cycle in range(1, cycles + 1):
        loaded = None  # the previous cycle's model goes before the next one loads
        gc.collect()
        started = time.perf_counter()
        loaded = open_bench_model(model, device, quant)
        load_s = time.perf_counter() - started
        if cycles > 1:
            memory = read_memory(loaded.device, loaded.weight_bytes, 0, 0)
            _print({"cycle": cycle, "load_s": round(load_s, 3), "device_used_bytes": memory.device_used_bytes,
                    "process_rss_bytes": memory.process_rss_bytes})
    after_load, resident = peak_rss_bytes(), read_memory("cpu", 0, 0, 0).process_rss_bytes
    if isinstance(loaded.backend, HFBackend):  # one request at a time, over its own cache: no batch runner
        loaded.backend.forward(PROBE_IDS, loaded.backend.new_cache(), 0)
    else:
        measure_prefill_ms(loaded, PROBE_IDS, 1)
    return {"load_s": round(load_s, 3), "weight_bytes": loaded.weight_bytes, "precision": loaded.precision,
            "formats": loaded.precision_label, **_estimate(loaded), "backend": type(loaded.backend).__name__, "rss_after_load_bytes": resident, "peak_rss_bytes": after_load,
            "peak_rss_after_prompt_bytes": peak_rss_bytes(), "disk_bytes_written": disk_bytes_written()}


def _estimate(loaded: Any) -> dict[str, int]:
    """The memory estimate (``memory_estimate.estimate_formats``) of ``loaded``'s file in its formats; none for a
    ``random:`` model, which has no file."""
    from engine.models.memory_estimate import estimate_formats
    from engine.models.model_files import inspect_model

    if not Path(loaded.path).exists():
        return {}
    estimate = estimate_formats(inspect_model(Path(loaded.path)), loaded.formats, loaded.context_length)
    return {"estimate_weight_bytes": estimate.weight_bytes, "estimate_kv_bytes": estimate.kv_bytes,
            "estimate_total_bytes": estimate.total_bytes}


def run_load_probe(model: str, quant: str, cycles: int, memory_limit_bytes: int | None, show,
                   device: str) -> dict[str, Any]:
    """The probe's figures from a fresh process (its cycle lines go to ``show``), or ``{"error": …}``."""
    def limit() -> None:
        if memory_limit_bytes:
            resource.setrlimit(resource.RLIMIT_AS, (memory_limit_bytes, memory_limit_bytes))

    command = [sys.executable, "-m", "engine.bench.load_probe", model, "--quant", quant, "--cycles", str(cycles),
               "--device", device]
    done = subprocess.run(command, capture_output=True, text=True, preexec_fn=limit, env=dict(os.environ))
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    for line in lines[:-1]:
        show(line)
    if done.returncode == 0 and lines:
        return lines[-1]
    reason = lines[-1]["error"] if lines and "error" in lines[-1] else _last_words(done)
    return {"error": reason}


def _last_words(done: subprocess.CompletedProcess) -> str:
    tail = (done.stderr.strip().splitlines() or ["no message"])[-1]
    return f"the load process exited with status {done.returncode}: {tail}"


def _print(record: dict[str, Any]) -> None:
    print(json.dumps(record), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.bench.load_probe", description=__doc__.split("\n")[0])
    parser.add_argument("model")
    parser.add_argument("--quant", default="auto")
    parser.add_argument("--cycles", type=int, default=1)
    parser.add_argument("--device", default="auto")
    args = parser.parse_args(argv)
    try:
        _print(probe(args.model, args.quant, args.cycles, args.device))
    except Exception as exc:  # reported as data: the benchmark shows it beside llama.cpp's figures
        _print({"error": f"{type(exc).__name__}: {exc}"})
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

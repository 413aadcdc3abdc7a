"""The ARM variant of Hearth's CPU kernels (``kernels_neon.c``) gives what PyTorch's ops give, checked here without an
ARM machine: cross-compiled for aarch64 with a small driver (``neon_driver.c``) and run under qemu-aarch64, each kernel
on inputs made here, its outputs compared with PyTorch's on the same inputs. Three builds: plain ARMv8-A on a CPU
without the dot-product extension (widening multiplies), the same library on one with it (sdot, chosen at run time),
and one built for ARMv8.2-A with it. Skipped where the cross compiler or qemu is absent (Debian:
gcc-aarch64-linux-gnu, qemu-user)."""

from __future__ import annotations

import ctypes
import math
import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.forward.attention import attend, attend_runs, causal_mask
from engine.forward.family import Clamp
from engine.forward.llama_forward import rotate_pairs_
from engine.forward.mlp import clamped_swiglu
from engine.forward.native import int4_scales, variants
from engine.forward.native.build import SIGNATURES
from engine.forward.native.int8_matmul import quantize as int8_quantize
from engine.forward.weights.cpu_int4_layout import codes_from_packed
from engine.forward.weights.quant_int import dequantize_int4, int4_groups_of
from engine.forward.windows import window_start

CROSS_COMPILER, EMULATOR = "aarch64-linux-gnu-gcc", "qemu-aarch64"
DRIVER = Path(__file__).with_name("neon_driver.c")
BUILDS = {  # name: the build's -march, the emulated CPU, whether that CPU has the dot-product extension
    "armv8-a on a cortex-a53": ("armv8-a", "cortex-a53", False),
    "armv8-a on a dotprod cpu": ("armv8-a", "max", True),
    "armv8.2-a+dotprod": ("armv8.2-a+dotprod", "max", True),
}

pytestmark = pytest.mark.skipif(
    shutil.which(CROSS_COMPILER) is None or shutil.which(EMULATOR) is None,
    reason=f"{CROSS_COMPILER} or {EMULATOR} is absent (Debian's gcc-aarch64-linux-gnu and qemu-user)")


@dataclass(frozen=True)
class ScratchBytes:
    """A zeroed buffer of ``size`` bytes the kernel may write (the matmuls' activation codes)."""

    size: int


@dataclass(frozen=True)
class NeonDriver:
    """The driver of one build, run under qemu as ``cpu`` (which has the dot-product extension where
    ``cpu_has_sdot``); calls write their tensors to ``folder``."""

    program: Path
    cpu: str
    cpu_has_sdot: bool
    folder: Path

    def run(self, *words: str) -> str:
        command = [EMULATOR, "-cpu", self.cpu, str(self.program), *words]
        environment = {**os.environ, "OMP_NUM_THREADS": "2"}  # the kernels' parallel loops split in two
        result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=environment)
        assert result.returncode == 0, result.stderr
        return result.stdout

    def takes_sdot(self) -> bool:
        return self.run("dot").strip() == "1"

    def call(self, kernel: str, *arguments: object) -> list[torch.Tensor]:
        """``kernel`` with ``arguments`` in the order and types of its ctypes signature (``build.SIGNATURES``): a
        tensor (contiguous) or a ``ScratchBytes`` for a pointer, an int or float for a number. Returns each tensor
        argument as the kernel left it, in order."""
        types = SIGNATURES[kernel]
        assert len(types) == len(arguments)
        words, tensors = [], []
        for index, (kind, value) in enumerate(zip(types, arguments)):
            if isinstance(value, torch.Tensor):
                path = self.folder / f"{kernel}-{index}.bin"
                path.write_bytes(value.contiguous().view(torch.uint8).numpy().tobytes())
                words.append(f"f:{path}")
                tensors.append((path, value))
            elif isinstance(value, ScratchBytes):
                words.append(f"s:{value.size}")
            elif value is None:  # a NULL pointer
                words.append("n:")
            else:
                letter = {ctypes.c_int: "i", ctypes.c_int64: "l", ctypes.c_float: "e"}[kind]
                words.append(f"{letter}:{value}")
        self.run(kernel, *words)
        return [_read(path.with_name(path.name + ".out"), like) for path, like in tensors]


def _read(path: Path, like: torch.Tensor) -> torch.Tensor:
    data = bytearray(path.read_bytes())
    return torch.frombuffer(data, dtype=torch.uint8).view(like.dtype).view(like.shape)


@pytest.fixture(scope="module", params=list(BUILDS))
def neon(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> NeonDriver:
    march, cpu, cpu_has_sdot = BUILDS[request.param]
    folder = tmp_path_factory.mktemp("neon")
    program = folder / "neon_driver"
    command = [CROSS_COMPILER, *variants.named("neon").flags, f"-march={march}", "-static",
               f"-I{variants.HERE}", str(DRIVER), "-o", str(program), "-lm"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return NeonDriver(program, cpu, cpu_has_sdot, folder)


def test_the_library_builds_cleanly_and_exports_every_function_the_loader_binds(tmp_path: Path):
    """Built as ``build`` builds it at run time (the variant's flags, a shared library), without a warning."""
    variant = variants.named("neon")
    library = tmp_path / variant.library_name()
    command = [CROSS_COMPILER, *variant.flags, "-shared", str(variant.source_path()), "-o", str(library), "-lm"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and not result.stderr, result.stderr
    symbols = subprocess.run([CROSS_COMPILER.replace("gcc", "nm"), "-D", "--defined-only", str(library)],
                             capture_output=True, text=True, timeout=60, check=True).stdout
    assert set(variant.exported()) <= {line.split()[-1] for line in symbols.splitlines()}


def test_the_kernels_take_sdot_exactly_where_the_cpu_has_it(neon: NeonDriver):
    assert neon.takes_sdot() == neon.cpu_has_sdot
    assert neon.run("amx_enable").strip() == "-1"  # no AMX functions in this variant


def _int4_layout(q: torch.Tensor) -> torch.Tensor:
    """Codes q [N, K] in 0…15 as the int4 layout's bytes [N, K / 2]: a block of 64 rows is [K, 32] bytes, byte
    (k, j) row j's code k low and row j + 32's high."""
    rows, width = q.shape
    blocks = q.view(-1, 64, width)  # [N / 64, 64, K]
    nibbles = torch.bitwise_left_shift(blocks[:, 32:], 4) | blocks[:, :32]  # [N / 64, 32, K]
    packed = nibbles.transpose(1, 2).contiguous().view(rows, width // 2)
    assert torch.equal(codes_from_packed(packed), q)  # the layout the engine reads back
    return packed


def _rounded_to_8_bits(x: torch.Tensor, group: int) -> torch.Tensor:
    """``x`` [M, K] as a batched step's rows reach the kernels: each group in int8 codes under its largest magnitude
    over 127."""
    grouped = x.unflatten(1, (-1, group))  # [M, G, group]
    scales = grouped.abs().amax(-1, keepdim=True) / 127
    return (torch.round(grouped / scales) * scales).flatten(1)


@pytest.mark.parametrize("codes", [2, 1])  # one sequence's rows, a batched step's
@pytest.mark.parametrize(("length", "group"), [(1, 32), (2, 32), (3, 32), (5, 128)])
def test_int4_rows_are_their_rounded_codes_times_the_dequantized_weight(neon: NeonDriver, length, group, codes):
    torch.manual_seed(length)
    width = 256 if group == 128 else 160
    groups = int4_groups_of(torch.randn(192, width) * 0.05, group)  # 3 blocks of 64 rows
    group_scales = int4_scales.block_scales(groups.scales_and_zeros)  # [N / 64, bytes]
    weight = dequantize_int4(groups.q, int4_scales.scales_and_zeros_of(group_scales, width // group), group)  # [N, K]
    x = torch.randn(length, width) * torch.logspace(-2, 1, width)  # groups of very different sizes
    scratch = ScratchBytes(length * (2 * width + 8 * width // group))
    (_, _, _, got) = neon.call("int4_matmul", x, length, width, _int4_layout(groups.q), group_scales, 192, group,
                               codes, scratch, torch.empty(length, 192))
    exact = x @ weight.t()
    scale = exact.abs().max()
    if codes == 2:
        assert ((got - exact).abs().max() / scale).item() < 1e-4
    else:
        assert ((got - _rounded_to_8_bits(x, group) @ weight.t()).abs().max() / scale).item() < 2e-6


@pytest.mark.parametrize("codes", [2, 1])
@pytest.mark.parametrize("length", [1, 3])
def test_int8_rows_match_the_dequantized_weight(neon: NeonDriver, length, codes):
    torch.manual_seed(length)
    weight = torch.randn(192, 160) * 0.05  # 3 blocks of 64 rows, 5 groups of 32
    quantized, scales = int8_quantize(weight)  # [N, K] int8, [N, K / 32] fp16
    dequantized = (quantized.float().unflatten(1, (-1, 32)) * scales.float().unsqueeze(-1)).flatten(1)  # [N, K]
    shifted = (quantized.to(torch.int16) + 128).to(torch.uint8)  # q + 128
    packed = shifted.view(3, 4, 16, 40, 4).permute(0, 3, 1, 2, 4).contiguous()  # [N / 64, K / 4, 4, 16, 4]
    block_scales = scales.view(3, 64, 5).transpose(1, 2).contiguous()  # [N / 64, K / 32, 64]
    x = torch.randn(length, 160) * torch.logspace(-2, 1, 160)
    (_, _, _, got) = neon.call("int8_matmul", x, length, 160, packed, block_scales, 192, codes,
                               ScratchBytes(length * (2 * 160 + 8 * 5)), torch.empty(length, 192))
    exact = x @ dequantized.t()
    scale = exact.abs().max()
    if codes == 2:
        assert ((got - exact).abs().max() / scale).item() < 1e-4
    else:  # exactly the 8-bit rows' product, to fp32's rounding of the sums
        assert ((got - _rounded_to_8_bits(x, 32) @ dequantized.t()).abs().max() / scale).item() < 2e-6


def _bounds(runs: Sequence[slice]) -> torch.Tensor:
    return torch.tensor([(run.start, run.stop) for run in runs], dtype=torch.int32).view(-1, 2)


@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), [(6, 2, 32), (28, 4, 128)])
@pytest.mark.parametrize("with_sinks", [False, True])
def test_decode_attention_matches_pytorchs_over_runs_of_the_bf16_pool(neon: NeonDriver, heads, kv_heads, head_dim,
                                                                      with_sinks):
    torch.manual_seed(0)
    positions = 512
    layer = torch.randn(2, kv_heads, positions, head_dim).bfloat16()  # [2, Hkv, P, hd]
    runs = [(slice(0, 1),), (slice(64, 64 + 130),), (slice(300, 364), slice(400, 411))]  # one, past a tile, two runs
    q = torch.randn(len(runs) + 1, heads, head_dim) * 0.3  # the last row: not attended here
    first_run = torch.tensor([0, 1, 2, 4], dtype=torch.int32)
    rows = torch.arange(len(runs), dtype=torch.int32)
    bounds = _bounds([run for row_runs in runs for run in row_runs])
    sinks = torch.randn(heads) * 2 if with_sinks else None  # gpt-oss's: a logit per query head
    (_, out, *_) = neon.call("decode_attention", q, torch.full_like(q, 7.0), layer, rows, len(runs), first_run,
                             bounds, heads, kv_heads, head_dim, positions, sinks)
    for row, row_runs in enumerate(runs):
        views = tuple((layer[0, :, r].float().transpose(1, 2), layer[1, :, r].float()) for r in row_runs)
        expected = attend_runs(q[row].view(kv_heads, -1, head_dim), views,
                               torch.empty(kv_heads, heads // kv_heads, head_dim), sinks=sinks)
        assert torch.allclose(out[row], expected.view(heads, head_dim), atol=1e-5)
    assert torch.equal(out[-1], torch.full_like(out[-1], 7.0))


@pytest.mark.parametrize(("start", "length", "heads", "kv_heads", "head_dim", "window"), [
    (0, 5, 9, 3, 64, None), (250, 70, 9, 3, 64, None),  # 250 + 70: past the first run
    (250, 19, 28, 4, 128, None), (0, 40, 32, 32, 64, None),  # 7 query heads a kv head; one
    (40, 33, 9, 3, 64, 16), (250, 70, 9, 3, 64, 100),  # windows
])
def test_chunk_attention_matches_sdpa_with_its_mask(neon: NeonDriver, start, length, heads, kv_heads, head_dim,
                                                    window):
    """The chunk's runs hold positions ``first`` … of a shared prefix of 300 positions, then its own blocks."""
    torch.manual_seed(start)
    first = window_start(start, window)
    layer = torch.randn(2, kv_heads, 1024 + length, head_dim).bfloat16()  # [2, Hkv, P, hd]
    seen = start + length
    runs = tuple(run for run in (slice(100 + first, 100 + min(seen, 300)),
                                 slice(600 + max(first, 300) - 300, 600 + seen - 300)) if run.stop > run.start)
    q = torch.randn(length + 2, heads, head_dim) * 0.3  # rows 0 and 1: another sequence's
    (_, out, *_) = neon.call("chunk_attention", q, torch.full_like(q, 7.0), layer, 2, length, start - first,
                             _bounds(runs), len(runs), heads, kv_heads, head_dim, layer.shape[2], window or 0)
    keys, values = (torch.cat([layer[i, :, run] for run in runs], dim=1) for i in (0, 1))  # [Hkv, T, hd]
    expected = attend(q[2:], keys, values, causal_mask(start, length, torch.float32, torch.device("cpu"), first,
                                                       window))
    assert torch.allclose(out[2:], expected, atol=1e-5)
    assert torch.equal(out[:2], torch.full_like(out[:2], 7.0))


def test_rms_norm_and_swiglu_match_pytorchs(neon: NeonDriver):
    torch.manual_seed(0)
    x = torch.randn(3, 576) * 3
    (_, normed) = neon.call("rms_norm", x, 3, 576, 1e-5, torch.empty_like(x))
    assert torch.allclose(normed, torch.nn.functional.rms_norm(x, (576,), eps=1e-5), atol=1e-5)
    gate_up = torch.randn(2, 2 * 96) * 6
    gate_up[0, :4] = torch.tensor([-100.0, -20.0, 20.0, 100.0])  # far into both tails of the sigmoid
    (_, got) = neon.call("swiglu", gate_up, 2, 96, math.inf, 1.0, 0.0, torch.empty(2, 96))
    expected = torch.nn.functional.silu(gate_up[:, :96]) * gate_up[:, 96:]
    assert torch.allclose(got, expected, rtol=2e-6, atol=1e-6)
    gate_up[1, 96:100] = torch.tensor([-100.0, -7.5, 7.5, 100.0])  # ups beyond gpt-oss's limit, either side
    gate_up[1, 5] = float("nan")
    (_, got) = neon.call("swiglu", gate_up, 2, 96, 7.0, 1.702, 1.0, torch.empty(2, 96))
    expected = clamped_swiglu(gate_up.clone(), Clamp(alpha=1.702, limit=7.0))
    assert torch.allclose(got, expected, rtol=2e-6, atol=1e-5, equal_nan=True) and got[1, 5].isnan()


def test_rotating_and_storing_new_rows_is_pytorchs_rotation_and_bf16_cache_write(neon: NeonDriver):
    torch.manual_seed(1)
    length, heads, kv_heads, head_dim = 3, 6, 2, 64
    qkv = torch.randn(length, heads + 2 * kv_heads, head_dim)  # [S, H + 2Hkv, hd]
    angles = torch.rand(length, 1, head_dim // 2) * 6.3
    turns = torch.polar(torch.full_like(angles, 0.9), angles)  # [S, 1, hd/2]
    qkv[0, -1, :4] = torch.tensor([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 3.4e38])  # ties to even, overflow
    qkv[1, -1, 0] = float("nan")
    layer = torch.randn(2, kv_heads, 16, head_dim).bfloat16()  # [2, Hkv, P, hd]
    slots = torch.tensor([5, 0, 11])  # [S] int64
    expected_qkv, expected_layer = qkv.clone(), layer.clone()
    rotate_pairs_(expected_qkv[:, : heads + kv_heads], turns)
    expected_layer[:, :, slots] = expected_qkv[:, heads:].transpose(0, 1).unflatten(0, (2, kv_heads)).bfloat16()
    pairs = torch.view_as_real(turns).contiguous()  # [S, 1, hd/2, 2]: cos, sin
    (got_qkv, _, got_layer, _) = neon.call("rotate_and_store", qkv, pairs, length, heads, kv_heads, head_dim, layer,
                                           16, slots)
    assert torch.allclose(got_qkv[:, :heads], expected_qkv[:, :heads], atol=1e-6)  # the queries, in place
    values, expected_values = got_layer[1].float(), expected_layer[1].float()  # rounded to nearest even
    assert torch.allclose(values, expected_values, rtol=0, atol=0, equal_nan=True) and values.isnan().sum() == 1
    keys, expected_keys = got_layer[0].float(), expected_layer[0].float()
    assert torch.allclose(keys, expected_keys, rtol=2**-8, atol=0) and (keys != expected_keys).float().mean() < 0.01


def test_a_gguf_files_nibbles_become_the_int4_layout(neon: NeonDriver):
    """Q4_0's blocks: a run of 16 bytes holds codes i (low nibbles) and 16 + i (high), two bytes of scale between
    runs."""
    torch.manual_seed(2)
    rows, runs, length = 128, 3, 16
    q = torch.randint(0, 16, (rows, runs, 2, length), dtype=torch.uint8)  # [n, R, 2, L]: codes 2Lr + L * half + i
    file = torch.randint(0, 256, (rows, runs, length + 2), dtype=torch.uint8)  # each run then its scale's bytes
    file[:, :, :length] = q[:, :, 0] | torch.bitwise_left_shift(q[:, :, 1], 4)
    (_, got) = neon.call("int4_layout_from_nibbles", file, rows, runs, length, runs * (length + 2), length + 2,
                         torch.zeros(rows, runs * length, dtype=torch.uint8))
    assert torch.equal(got, _int4_layout(q.view(rows, -1)))


@pytest.mark.parametrize("codes", [2, 1, 0])  # one sequence's rows, a batched step's, the fp32 plan's
def test_mxfp4_rows_match_the_matmul_over_their_decoded_weight(neon: NeonDriver, codes: int):
    """gpt-oss's experts as GGUF's MXFP4 blocks (17 bytes per 32 weights), through a table lookup: int8 products with
    the activations' codes, or fp32 products with the activations as they are."""
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    rng = np.random.default_rng(3)
    rows, width, count = 70, 96, 5
    blocks = quantize((rng.standard_normal((rows, width)) * 4).astype(np.float32), GGMLQuantizationType.MXFP4)
    weight = torch.from_numpy(dequantize(blocks, GGMLQuantizationType.MXFP4))  # [N, K]
    x, bias = torch.randn(count, width) * torch.logspace(-2, 1, width), torch.randn(rows)
    (_, _, _, got) = neon.call("mxfp4_matmul", x, count, width, torch.from_numpy(blocks.copy()), rows, bias,
                               codes, ScratchBytes(count * (5 * width + width // 4)), torch.empty(count, rows))
    exact = torch.nn.functional.linear(x, weight, bias)
    scale = (exact - bias).abs().max()
    if codes == 0:
        torch.testing.assert_close(got, exact, atol=1e-4, rtol=1e-5)
    elif codes == 2:
        assert ((got - exact).abs().max() / scale).item() < 1e-4
    else:
        assert ((got - torch.nn.functional.linear(_rounded_to_8_bits(x, 32), weight, bias)).abs().max()
                / scale).item() < 2e-6

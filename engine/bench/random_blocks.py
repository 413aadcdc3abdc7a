"""Random quantized weight blocks in llama.cpp's own byte layout (main thread of a benchmark, or a test).

gguf-py can read every block type but cannot write the K-quants, so the blocks are
built here as raw bytes, following the structs of llama.cpp's ``ggml-common.h``.
The quants are uniform random bytes; the scales are set so that each weight
dequantizes to about ``std`` around zero (a random model's activations then stay
finite through every layer, in llama.cpp as in Hearth):

- ``Q4_0``  ``d, qs[16]``: ``w = d·(q - 8)``, 32 weights per block.
- ``Q4_1``  ``d, m, qs[16]``: ``w = d·q + m``.
- ``Q5_0``  ``d, qh[4], qs[16]``: ``w = d·(q - 16)``, q of 5 bits.
- ``Q8_0``  ``d, qs[32]`` (int8): ``w = d·q``.
- ``Q4_K``  ``d, dmin, scales[12], qs[128]``: 256 weights in 8 groups of 32,
  ``w = d·sc·q - dmin·mn`` with 6-bit ``sc`` and ``mn`` packed into 12 bytes.
- ``Q6_K``  ``ql[128], qh[64], scales[16]`` (int8), ``d``: 16 groups of 16,
  ``w = d·sc·(q - 32)``, q of 6 bits.
- ``MXFP4`` ``e, qs[16]``: ``w = v[q]·2^(e - 128)``, ``v`` the doubled e2m1 values (gpt-oss's experts).
"""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

Q = GGMLQuantizationType
BLOCK_FIELDS: dict[GGMLQuantizationType, list[tuple]] = {
    Q.Q4_0: [("d", "<f2"), ("qs", "u1", 16)],
    Q.Q4_1: [("d", "<f2"), ("m", "<f2"), ("qs", "u1", 16)],
    Q.Q5_0: [("d", "<f2"), ("qh", "u1", 4), ("qs", "u1", 16)],
    Q.Q8_0: [("d", "<f2"), ("qs", "i1", 32)],
    Q.Q4_K: [("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", 12), ("qs", "u1", 128)],
    Q.Q5_K: [("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", 12), ("qh", "u1", 32), ("qs", "u1", 128)],
    Q.Q6_K: [("ql", "u1", 128), ("qh", "u1", 64), ("scales", "i1", 16), ("d", "<f2")],
    Q.MXFP4: [("e", "u1"), ("qs", "u1", 16)],
}
UNIFORM_STD = {4: 4.61, 5: 9.23, 6: 18.47, 8: 73.9}  # std of a uniform q of this many bits
K4_SCALES = (4, 8)  # Q4_K group scales: mn = 7.5·sc stays within 6 bits
K5_SCALES = (2, 4)  # Q5_K's: mn = 15.5·sc stays within 6 bits
K6_SCALES = (8, 16)
MXFP4_HALVES_RMS = float(np.sqrt(2 * (1 + 4 + 9 + 16 + 36 + 64 + 144) / 16))  # 0, ±1, ±2, ±3, ±4, ±6, ±8, ±12


def block_dtype(qtype: GGMLQuantizationType) -> np.dtype:
    dtype = np.dtype(BLOCK_FIELDS[qtype])
    assert dtype.itemsize == GGML_QUANT_SIZES[qtype][1], qtype
    return dtype


def random_blocks(qtype: GGMLQuantizationType, rows: int, cols: int, std: float, rng: np.random.Generator) -> np.ndarray:
    """A ``[rows, cols]`` weight as raw blocks: ``uint8 [rows, cols / block · block bytes]``."""
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    if cols % block_size:
        raise ValueError(f"{qtype.name} needs rows of a multiple of {block_size} weights, not {cols}")
    count = rows * cols // block_size
    raw = np.frombuffer(bytearray(rng.bytes(count * type_size)), dtype=np.uint8)  # writable
    blocks = raw.view(block_dtype(qtype))  # [count]
    jitter = rng.uniform(0.8, 1.2, size=count).astype(np.float32)  # [count]
    SCALERS[qtype](blocks, std * jitter, rng)
    return raw.reshape(rows, cols // block_size * type_size)


def _scale_q4_0(blocks: np.ndarray, std: np.ndarray, rng: np.random.Generator) -> None:
    blocks["d"] = std / UNIFORM_STD[4]


def _scale_q4_1(blocks: np.ndarray, std: np.ndarray, rng: np.random.Generator) -> None:
    d = std / UNIFORM_STD[4]
    blocks["d"] = d
    blocks["m"] = -7.5 * d


def _scale_q5_0(blocks: np.ndarray, std: np.ndarray, rng: np.random.Generator) -> None:
    blocks["d"] = std / UNIFORM_STD[5]


def _scale_q8_0(blocks: np.ndarray, std: np.ndarray, rng: np.random.Generator) -> None:
    blocks["d"] = std / UNIFORM_STD[8]


def _scale_mxfp4(blocks: np.ndarray, std: np.ndarray, rng: np.random.Generator) -> None:
    """e8m0 exponents: a block's scale ``2^(e - 128)`` is a power of two, so each block takes the one below
    ``std / MXFP4_HALVES_RMS`` (uniform random codes' spread over the doubled e2m1 values) or the one above, the
    higher with the chance that makes the weights' mean square ``std²``."""
    exact = np.log2(std / MXFP4_HALVES_RMS)  # [count]
    below = np.floor(exact)
    higher = rng.random(exact.shape) < (4.0 ** (exact - below) - 1) / 3
    blocks["e"] = np.clip(128 + below + higher, 0, 255).astype(np.uint8)


def _scale_q4_k(blocks: np.ndarray, std: np.ndarray, rng: np.random.Generator) -> None:
    _scale_k_groups(blocks, std, rng, 4, K4_SCALES)


def _scale_q5_k(blocks: np.ndarray, std: np.ndarray, rng: np.random.Generator) -> None:
    _scale_k_groups(blocks, std, rng, 5, K5_SCALES)


def _scale_k_groups(blocks: np.ndarray, std: np.ndarray, rng: np.random.Generator, bits: int,
                    scales: tuple[int, int]) -> None:
    """Q4_K's and Q5_K's eight group scales and mins (packed alike), each group centred on zero."""
    sc = rng.integers(scales[0], scales[1] + 1, size=(len(blocks), 8), dtype=np.uint8)  # [N, 8]
    mn = np.round((2 ** bits - 1) / 2 * sc).astype(np.uint8)  # [N, 8]: centres each group on zero
    d = std / (UNIFORM_STD[bits] * sum(scales) / 2)
    blocks["d"] = d
    blocks["dmin"] = d
    blocks["scales"] = pack_k4_scales(sc, mn)


def _scale_q6_k(blocks: np.ndarray, std: np.ndarray, rng: np.random.Generator) -> None:
    blocks["scales"] = rng.integers(K6_SCALES[0], K6_SCALES[1] + 1, size=(len(blocks), 16), dtype=np.int8)
    blocks["d"] = std / (UNIFORM_STD[6] * sum(K6_SCALES) / 2)


def pack_k4_scales(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """Eight 6-bit scales and eight 6-bit mins (``[N, 8]`` each) as Q4_K's 12 bytes (``[N, 12]``).

    Bytes 0-3 hold ``sc[0:4]`` and 4-7 ``mn[0:4]`` in their low 6 bits, with the top two
    bits of ``sc[4:8]`` / ``mn[4:8]`` above; bytes 8-11 hold the low nibbles of
    ``sc[4:8]`` (low) and ``mn[4:8]`` (high), as ``get_scale_min_k4`` reads them.
    """
    packed = np.empty((len(sc), 12), dtype=np.uint8)  # [N, 12]
    packed[:, 0:4] = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
    packed[:, 4:8] = mn[:, :4] | ((mn[:, 4:] >> 4) << 6)
    packed[:, 8:12] = (sc[:, 4:] & 0xF) | ((mn[:, 4:] & 0xF) << 4)
    return packed


SCALERS = {
    Q.Q4_0: _scale_q4_0, Q.Q4_1: _scale_q4_1, Q.Q5_0: _scale_q5_0, Q.Q8_0: _scale_q8_0,
    Q.Q4_K: _scale_q4_k, Q.Q5_K: _scale_q5_k, Q.Q6_K: _scale_q6_k, Q.MXFP4: _scale_mxfp4,
}

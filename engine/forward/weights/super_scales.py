"""4-bit groups' scales as Q4_K keeps them: small integer codes of a super-scale per 256 weights (engine thread).

``Int4Groups`` hold a bf16 scale and zero point per 32 weights, 32 bits a group: a
bit a weight on top of its 4. Q4_K stores per 256 weights an fp16 ``d`` and ``dmin``
and per 32 a 6-bit scale ``sc`` and min ``mn``, ``w = d * sc * q - dmin * mn``: half a
bit. The CPU's int4 kernel (``native.int4_matmul``) reads a coded form of the same:
an int8 ``sc`` and ``mn`` per group and fp16 ``d``, ``dmin`` per super-group, 0.63
bits a weight (SmolLM2-1.7B's Q4_K_M decode step reads 1 038 MB instead of 1 113; its step time stayed
the same, the codes' conversion taking what the bytes saved). A Q4_K block's own
codes come back exactly; other groups (a Q6_K tensor requantized to 4 bits) are
rounded to codes of up to 127 (7 bits, finer than Q4_K's 6) before they are packed.

Scales and zeros are [G, N, 2] (group, row, scale and zero: ``w = (q - 8) * s + z``,
so a group's min is ``8s - z``); super-scales [G / 8, N, 2] (``d``, ``dmin``); codes
[G, N, 2] (``sc``, ``mn``).
"""

from __future__ import annotations

import torch

SUPER_GROUPS = 8  # groups of 32 a super-scale covers: Q4_K's 256 weights
CODE_LIMIT = 127  # the largest code an int8 holds both signs of


def codable(width: int, group: int) -> bool:
    """Whether a weight ``width`` wide in groups of ``group`` has whole super-groups of 32-weight groups."""
    return group == 32 and width % (group * SUPER_GROUPS) == 0


def codes_of(scales_and_zeros: torch.Tensor, super_scales: torch.Tensor) -> torch.Tensor:
    """Each group's scale and min over its super-group's ``d`` and ``dmin``, rounded: int8 [G, N, 2] (exact for a
    Q4_K block's own, which are those integers times ``d``; a zero super-scale gives codes 0)."""
    groups, rows, _ = scales_and_zeros.shape
    values = _scales_and_mins(scales_and_zeros).view(groups // SUPER_GROUPS, SUPER_GROUPS, rows, 2)
    supers = super_scales.float().unsqueeze(1)  # [G / 8, 1, N, 2]
    codes = torch.where(supers != 0, values / torch.where(supers != 0, supers, 1.0), 0.0)
    return codes.round_().clamp_(-CODE_LIMIT, CODE_LIMIT).to(torch.int8).view(groups, rows, 2)


def rounded_to_codes(scales_and_zeros: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Any groups' scales and zeros [G, N, 2] rounded to the coded form: (the scales and zeros they become, fp32
    [G, N, 2]; their super-scales [G / 8, N, 2], fp16 values in fp32). Each super-scale maps its super-group's
    largest magnitude to ``CODE_LIMIT`` (or below, where fp16 rounds it down)."""
    groups, rows, _ = scales_and_zeros.shape
    values = _scales_and_mins(scales_and_zeros).view(groups // SUPER_GROUPS, SUPER_GROUPS, rows, 2)
    supers = (values.abs().amax(1) / CODE_LIMIT).half().float()  # [G / 8, N, 2]
    return scales_and_zeros_of(codes_of(scales_and_zeros, supers), supers), supers


def scales_and_zeros_of(codes: torch.Tensor, super_scales: torch.Tensor) -> torch.Tensor:
    """The scales and zeros [G, N, 2] fp32 that codes [G, N, 2] and super-scales [G / 8, N, 2] stand for."""
    values = codes.float() * super_scales.float().repeat_interleave(SUPER_GROUPS, dim=0)  # [G, N, 2]: s, min
    scales, mins = values.unbind(-1)
    return torch.stack([scales, scales * 8 - mins], dim=-1)


def _scales_and_mins(scales_and_zeros: torch.Tensor) -> torch.Tensor:
    """[G, N, 2] scales and zeros as scales and mins (``w = s q - min``), fp32 [G, N, 2]."""
    scales, zeros = scales_and_zeros.float().unbind(-1)
    return torch.stack([scales, scales * 8 - zeros], dim=-1)

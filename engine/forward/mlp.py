"""The dense MLP of Llama-family layers as the fast path runs it (engine thread): SiLU- or GELU-gated (Gemma's),
or gpt-oss's clamped SwiGLU (``family.Clamp``), gate and up as one matmul whose ``Linear`` holds the MLP's input
norm weight (``quant.Linear``'s ``input_scale``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.forward.family import Clamp
from engine.forward.native import norm as native_norm
from engine.forward.weights.quant import Linear


def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) * up from ``gate_up`` [S, 2F]: [S, F], in Hearth's CPU kernel or in place in its gate half."""
    if native_norm.swiglu_covers(gate_up):
        return native_norm.swiglu(gate_up)
    width = gate_up.shape[1] // 2
    gate = F.silu(gate_up[:, :width], inplace=True)  # [S, F]
    return gate.mul_(gate_up[:, width:])


def gated(gate_up: torch.Tensor, activation: str | Clamp) -> torch.Tensor:
    """The gated activation of ``gate_up`` [S, 2F]: [S, F]; ``activation`` "silu" (``swiglu``), "gelu_tanh"
    (GELU's tanh approximation of the gate, Gemma's) or a ``Clamp`` (gpt-oss's, ``clamped_swiglu``)."""
    if activation == "silu":
        return swiglu(gate_up)
    if isinstance(activation, Clamp):
        if native_norm.swiglu_covers(gate_up):
            return native_norm.swiglu(gate_up, activation)
        return clamped_swiglu(gate_up, activation)
    width = gate_up.shape[1] // 2
    return F.gelu(gate_up[:, :width], approximate="tanh").mul_(gate_up[:, width:])  # [S, F]


def clamped_swiglu(gate_up: torch.Tensor, clamp: Clamp) -> torch.Tensor:
    """gpt-oss's gate of ``gate_up`` [S, 2F] (its gate half, then its up half): ``(up + 1) * g * sigmoid(alpha g)``
    over the clamped halves (``family.Clamp``), [S, F], in PyTorch's ops (``native.norm.swiglu`` where the kernels
    are)."""
    width = gate_up.shape[1] // 2
    gate = gate_up[:, :width].clamp(max=clamp.limit)  # [S, F]
    up = gate_up[:, width:].clamp(-clamp.limit, clamp.limit)  # [S, F]
    return gate.mul_(torch.sigmoid(gate * clamp.alpha)).mul_(up.add_(1.0))


@dataclass
class GatedMlp:
    """``down(act(gate) * up)`` with gate and up as one ``Linear`` (D -> 2F) and down (F -> D); ``activation`` as
    ``gated`` takes it."""

    gate_up: Linear
    down: Linear
    activation: str | Clamp = "silu"

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        return self.down(gated(self.gate_up(h), self.activation))  # [S, D] -> [S, D]

    @property
    def linears(self) -> tuple[Linear, ...]:
        return self.gate_up, self.down

    @property
    def nbytes(self) -> int:
        return self.gate_up.nbytes + self.down.nbytes

    @property
    def one_row_nbytes(self) -> int:
        """Weight bytes one decode row reads."""
        return self.gate_up.one_row_nbytes + self.down.one_row_nbytes

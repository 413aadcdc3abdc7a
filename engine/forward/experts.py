"""Qwen2-MoE's and Qwen3-MoE's sparse MLP block as the fast path runs it (engine thread).

A router picks each row's ``top_k`` experts by softmax (their weights renormalised to sum to one where
``normalise_top_k``), each expert a ``GatedMlp`` of its own; Qwen2-MoE adds a shared expert, always run, scaled by
the sigmoid of one more row of the router. A step's rows are grouped by expert, so each active expert's weights are
read once per step, in one matmul over every row routed to it; experts no row picked are not touched. The block
takes the normalised input without the norm's weight and multiplies that in once for the router and all its experts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from engine.forward.mlp import GatedMlp
from engine.forward.weights.quant import Linear

ROUTER = "mlp.gate.weight"  # a layer's router [E, D], under its prefix: the layer is a mixture where it has one
SHARED = "mlp.shared_expert."  # Qwen2-MoE's shared expert's gate_proj, up_proj, down_proj
SHARED_GATE = "mlp.shared_expert_gate.weight"  # [1, D]: its gate's row
FUSED_GATE_UP, FUSED_DOWN = "mlp.experts.gate_up_proj", "mlp.experts.down_proj"  # transformers' stacked experts


@dataclass
class MixtureOfExperts:
    """A sparse MLP block (see the module docstring).

    ``norm`` [D]: the post-attention RMSNorm's weight. ``router`` [E (+1), D] fp32: one row per expert, and where
    there is a ``shared`` expert its gate's row last. ``experts``: E ``GatedMlp``s.
    """

    norm: torch.Tensor
    router: torch.Tensor
    experts: Sequence[GatedMlp]
    top_k: int
    normalise_top_k: bool
    shared: GatedMlp | None = None

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        h = h * self.norm  # [R, D]
        logits = h @ self.router.t()  # [R, E (+1)]
        count = len(self.experts)
        weights, chosen = torch.softmax(logits[:, :count], dim=-1).topk(self.top_k, dim=-1)  # [R, k] each
        if self.normalise_top_k:
            weights /= weights.sum(dim=-1, keepdim=True)
        out = self._routed(h, weights, chosen)  # [R, D]
        if self.shared is not None:
            out.addcmul_(torch.sigmoid(logits[:, count:]), self.shared(h))  # [R, 1] * [R, D]
        return out

    def _routed(self, h: torch.Tensor, weights: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
        """The sum over each row's chosen experts of their outputs times their weights, [R, D]: the rows grouped
        by expert, one call of each active expert over all its rows, results added back to their rows."""
        rows = h.shape[0]
        if rows == 1:  # a lone decode row: its k experts on the row itself, no grouping
            out = torch.zeros_like(h)  # [1, D]
            for expert, weight in zip(chosen[0].tolist(), weights[0].tolist()):
                out.add_(self.experts[expert](h), alpha=weight)
            return out
        slots = chosen.flatten()  # [R k]: each routed (row, choice)'s expert
        order = slots.argsort(stable=True)  # [R k]: slots grouped by expert
        counts = torch.bincount(slots, minlength=len(self.experts))  # [E]
        active = counts.nonzero().flatten()  # [A]: the chosen experts, in the order the slots are grouped
        routed_rows = order // self.top_k  # [R k]: each grouped slot's row
        routed_weights = weights.flatten()[order].unsqueeze(1)  # [R k, 1]
        out = torch.zeros_like(h)  # [R, D]
        start = 0
        for expert, count in zip(active.tolist(), counts[active].tolist()):
            end = start + count
            own_rows = routed_rows[start:end]  # [n]
            out.index_add_(0, own_rows, self.experts[expert](h[own_rows]).mul_(routed_weights[start:end]))
            start = end
        return out

    @property
    def linears(self) -> tuple[Linear, ...]:
        shared = self.shared.linears if self.shared is not None else ()
        return tuple(linear for expert in self.experts for linear in expert.linears) + shared

    @property
    def nbytes(self) -> int:
        return sum(linear.nbytes for linear in self.linears) + self.router.numel() * self.router.element_size()

    @property
    def one_row_nbytes(self) -> int:
        """Weight bytes one decode row reads: its ``top_k`` experts (of the average size), the shared one, the
        router."""
        routed = sum(expert.one_row_nbytes for expert in self.experts) * self.top_k // len(self.experts)
        shared = self.shared.one_row_nbytes if self.shared is not None else 0
        return routed + shared + self.router.numel() * self.router.element_size()


def mixture_of_experts(config: Any, tensor: Callable[[str], Any], has: Callable[[str], bool],
                       gated: Callable[[Any, Any, Any, bool], GatedMlp]) -> MixtureOfExperts:
    """A layer's ``MixtureOfExperts`` from its state: ``tensor(name)`` a weight under the layer's prefix (fp32, or
    in a file's 4-bit groups), ``has(name)`` whether the layer holds it, ``gated(gate, up, down, expert)`` the
    ``GatedMlp`` of those weights (``expert``: in the experts' format, else as the dense layers are).

    Each expert's weights come under names of their own (``mlp.experts.N.gate_proj.weight``: checkpoints, and a
    GGUF file's 3-D tensors as ``gguf_direct`` hands them), or as transformers' model holds them, stacked
    (``mlp.experts.gate_up_proj`` [E, 2F, D], ``mlp.experts.down_proj`` [E, D, F]).
    """
    if has(FUSED_GATE_UP):
        gate_up, down = tensor(FUSED_GATE_UP), tensor(FUSED_DOWN)  # [E, 2F, D], [E, D, F]
        experts = [gated(*gate_up[index].chunk(2), down[index], True) for index in range(config.num_experts)]
    else:
        experts = [gated(*(tensor(f"mlp.experts.{index}.{name}_proj.weight") for name in ("gate", "up", "down")),
                         True) for index in range(config.num_experts)]
    router = tensor(ROUTER)  # [E, D]
    shared = None
    if has(SHARED + "gate_proj.weight"):
        shared = gated(*(tensor(f"{SHARED}{name}_proj.weight") for name in ("gate", "up", "down")), False)
        router = torch.cat([router, tensor(SHARED_GATE).reshape(1, -1)])  # [E + 1, D]
    return MixtureOfExperts(tensor("post_attention_layernorm.weight"), router.contiguous(), experts,
                            config.num_experts_per_tok, bool(getattr(config, "norm_topk_prob", False)), shared)

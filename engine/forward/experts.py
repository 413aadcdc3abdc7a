"""Qwen2-MoE's, Qwen3-MoE's and gpt-oss's sparse MLP block as the fast path runs it (engine thread).

A router picks each row's ``top_k`` experts by softmax (their weights renormalised to sum to one where
``normalise_top_k``; gpt-oss's router adds a bias to its logits and takes the softmax of the top k alone),
each expert a ``GatedMlp`` of its own (gpt-oss's with biases and its clamped gate); Qwen2-MoE adds a shared expert, always run, scaled by
the sigmoid of one more row of the router. A step's rows are grouped by expert, so each active expert's weights are
read once per step, in one matmul over every row routed to it; experts no row picked are not touched. Where the
experts are MXFP4 blocks in Hearth's CPU kernels, a step of up to ``GROUPED_ROWS`` rows (a decode step, a batched
one) makes one call for all its experts' gate and up, and one for their down (``Mxfp4Experts``). The block takes the
normalised input without the norm's weight and multiplies that in once for the router and all its experts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from engine.forward.family import Family
from engine.forward.mlp import GatedMlp, gated
from engine.forward.native.scratch import Scratch
from engine.forward.weights.mxfp4 import Mxfp4Experts, Mxfp4Rows, codes_for
from engine.forward.weights.quant import Linear

ROUTERS = ("mlp.gate.weight", "mlp.router.weight")  # a layer's router [E, D] (Qwen's, gpt-oss's), under its
# prefix: the layer is a mixture where it has one
ROUTER_BIAS = "mlp.router.bias"  # gpt-oss's [E]
SHARED = "mlp.shared_expert."  # Qwen2-MoE's shared expert's gate_proj, up_proj, down_proj
SHARED_GATE = "mlp.shared_expert_gate.weight"  # [1, D]: its gate's row
FUSED_GATE_UP, FUSED_DOWN = "mlp.experts.gate_up_proj", "mlp.experts.down_proj"  # transformers' stacked experts
FUSED_BIAS = "_bias"  # gpt-oss's stacked experts' biases: ``mlp.experts.gate_up_proj_bias`` [E, 2F], down's [E, D]
BLOCKS, SCALES = "_blocks", "_scales"  # openai's checkpoints: the stacked experts in MXFP4 (``Mxfp4Rows``)
ROUTED_RESULTS = Scratch(torch.float32)
"""The CPU's routed rows' results, [R k, D] fp32: a prompt chunk's 512 rows of Qwen3-30B-A3B make 32 MiB, which glibc
hands out as fresh pages (past its mmap threshold, ``allocator``) in every layer where the buffer is not kept."""
GROUPED_ROWS = 8
"""Rows up to which a step's MXFP4 experts run as one call (``Mxfp4Experts``), the threads sharing every active
expert's weight; past them an expert can have enough rows for AMX's tiles, a call each."""


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
    router_bias: torch.Tensor | None = None  # [E] fp32, added to the router's logits (gpt-oss)
    top_k_before_softmax: bool = False  # the softmax over each row's top k logits alone (gpt-oss)
    grouped: tuple[Mxfp4Experts, Mxfp4Experts] | None = None  # every expert's gate_up, and down, as one call

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        h = h * self.norm  # [R, D]
        logits = h @ self.router.t()  # [R, E (+1)]
        count = len(self.experts)
        if self.router_bias is not None:
            logits += self.router_bias
        if self.top_k_before_softmax:
            top, chosen = logits[:, :count].topk(self.top_k, dim=-1)  # [R, k] each
            weights = top.softmax(dim=-1)
        else:
            weights, chosen = torch.softmax(logits[:, :count], dim=-1).topk(self.top_k, dim=-1)  # [R, k] each
        if self.normalise_top_k:
            weights /= weights.sum(dim=-1, keepdim=True)
        out = self._routed(h, weights, chosen)  # [R, D]
        if self.shared is not None:
            out.addcmul_(torch.sigmoid(logits[:, count:]), self.shared(h))  # [R, 1] * [R, D]
        return out

    def _routed(self, h: torch.Tensor, weights: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
        """The sum over each row's chosen experts of their outputs times their weights, [R, D]: the rows grouped
        by expert, one call of each active expert over the rows it gathers, every weighted result (``[R k, D]``,
        on the CPU in ``ROUTED_RESULTS``) added into its row in one ``index_add_``."""
        rows = h.shape[0]
        one_call = self.grouped is not None and rows <= GROUPED_ROWS
        if rows == 1 and not one_call:  # a lone decode row: its k experts on the row itself, no grouping
            out = torch.zeros_like(h)  # [1, D]
            for expert, weight in zip(chosen[0].tolist(), weights[0].tolist()):
                out.add_(self.experts[expert](h), alpha=weight)
            return out
        slots = chosen.flatten()  # [R k]: each routed (row, choice)'s expert
        order = slots.argsort(stable=True)  # [R k]: slots grouped by expert
        counts = torch.bincount(slots, minlength=len(self.experts))  # [E]
        active = counts.nonzero().flatten()  # [A]: the chosen experts, in the order the slots are grouped
        slot_rows, slot_weights = order // self.top_k, weights.flatten()[order].unsqueeze(1)  # [R k], [R k, 1]
        if one_call:
            results = self._in_one_call(h.index_select(0, slot_rows), active, counts[active], rows)  # [R k, D]
        else:
            results = _results_buffer(slot_rows.shape[0], h)  # [R k, D]
            start = 0
            for expert, count in zip(active.tolist(), counts[active].tolist()):
                end = start + count
                results[start:end] = self.experts[expert](h.index_select(0, slot_rows[start:end]))  # [n, D]
                start = end
        return torch.zeros_like(h).index_add_(0, slot_rows, results.mul_(slot_weights))  # [R, D]

    def _in_one_call(self, grouped: torch.Tensor, active: torch.Tensor, counts: torch.Tensor,
                     rows: int) -> torch.Tensor:
        """Every active expert's MLP over its ``counts`` rows of ``grouped`` [R k, D] (``_routed``'s), [R k, D]:
        gate and up in one call, the gated activation, down in one call (``grouped``). Codes as an expert's own
        call over the step's ``rows`` would round them (``codes_for``)."""
        gate_up, down = self.grouped
        codes = codes_for(rows)
        hidden = gated(gate_up(grouped, active, counts, codes), self.experts[0].activation)  # [R k, F]
        return down(hidden, active, counts, codes)  # [R k, D]

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
        shared = self.shared.one_row_nbytes if self.shared is not None else 0
        return self.routed_row_nbytes + shared + self.router.numel() * self.router.element_size()

    @property
    def routed_row_nbytes(self) -> int:
        """Weight bytes of one row's ``top_k`` experts (of the average size): what a row routed apart from a step's
        others adds to the step's reads."""
        return sum(expert.one_row_nbytes for expert in self.experts) * self.top_k // len(self.experts)


def _results_buffer(rows: int, h: torch.Tensor) -> torch.Tensor:
    """[rows, D] for ``_routed``'s results, rows of ``h`` [R, D]'s width and dtype: on the CPU one buffer that every
    layer of every step reuses (``ROUTED_RESULTS``), elsewhere a new tensor."""
    if h.device.type != "cpu":
        return h.new_empty(rows, h.shape[1])
    return ROUTED_RESULTS.take(rows * h.shape[1]).view(rows, h.shape[1])


def mixture_of_experts(config: Any, family: Family, tensor: Callable[[str], Any], has: Callable[[str], bool],
                       rows: Callable[[Sequence[str]], Any], gated: Callable[..., GatedMlp]) -> MixtureOfExperts:
    """A layer's ``MixtureOfExperts`` from its state: ``tensor(name)`` a weight under the layer's prefix (fp32, or
    in a file's 4-bit groups or MXFP4 blocks), ``has(name)`` whether the layer holds it, ``rows(names)`` those
    weights' rows one after another (gate's, then up's), ``gated(gate_up, down, expert, gate_up_bias,
    down_bias)`` the ``GatedMlp`` of those weights (``expert``: in the experts' format, else as the dense layers
    are).

    Each expert's weights come under names of their own (``mlp.experts.N.gate_proj.weight`` and its ``.bias``:
    checkpoints, and a GGUF file's 3-D tensors as ``gguf_direct`` hands them), or as transformers' model holds
    them, stacked (``mlp.experts.gate_up_proj`` [E, 2F, D], ``mlp.experts.down_proj`` [E, D, F]; gpt-oss's
    transposed, [E, D, 2F] with gate and up columns interleaved and [E, F, D], and their biases; or as openai's
    checkpoints hold them, in MXFP4 blocks and scales, [E, 2F, D / 32, 16] with gate and up rows interleaved and
    [E, D, F / 32, 16], which stay so).
    """
    count = getattr(config, "num_local_experts", None) or config.num_experts
    experts = [gated(gate_up, down, True, gate_up_bias, down_bias)
               for gate_up, down, gate_up_bias, down_bias in _expert_parts(count, family, tensor, has, rows)]
    router_name = next(name for name in ROUTERS if has(name))
    router = tensor(router_name)  # [E, D]
    shared = None
    if has(SHARED + "gate_proj.weight"):
        shared = gated(rows([f"{SHARED}{name}_proj.weight" for name in ("gate", "up")]),
                       tensor(f"{SHARED}down_proj.weight"), False)
        router = torch.cat([router, tensor(SHARED_GATE).reshape(1, -1)])  # [E + 1, D]
    return MixtureOfExperts(tensor("post_attention_layernorm.weight"), router.contiguous(), experts,
                            config.num_experts_per_tok, bool(getattr(config, "norm_topk_prob", False)), shared,
                            tensor(ROUTER_BIAS) if has(ROUTER_BIAS) else None, family.top_k_before_softmax,
                            _grouped(experts))


def _grouped(experts: Sequence[GatedMlp]) -> tuple[Mxfp4Experts, Mxfp4Experts] | None:
    """The experts' gate_up and down matmuls as one call each (``Mxfp4Experts``), where every one is MXFP4 that
    can join the others; else None."""
    gate_up = Mxfp4Experts.of([expert.gate_up.mxfp4 for expert in experts])
    down = Mxfp4Experts.of([expert.down.mxfp4 for expert in experts])
    return (gate_up, down) if gate_up is not None and down is not None else None


def _expert_parts(count: int, family: Family, tensor: Callable[[str], Any], has: Callable[[str], bool],
                  rows: Callable[[Sequence[str]], Any]) -> list[tuple[Any, ...]]:
    """Each expert's gate and up weights, gate's rows first [2F, D], and its down weight [D, F], its gate and up
    biases one after another [2F] and its down bias [D] (None where it has none): from transformers' stacked
    experts or under each expert's own names (``mixture_of_experts``)."""
    if has(FUSED_GATE_UP + BLOCKS):
        gate_up, down = (tensor(name + BLOCKS) for name in (FUSED_GATE_UP, FUSED_DOWN))  # uint8
        gate_up_scales, down_scales = (tensor(name + SCALES) for name in (FUSED_GATE_UP, FUSED_DOWN))
        biases = tensor(FUSED_GATE_UP + FUSED_BIAS), tensor(FUSED_DOWN + FUSED_BIAS)  # [E, 2F], [E, D]
        return [(Mxfp4Rows.from_checkpoint(torch.cat([gate_up[index][0::2], gate_up[index][1::2]]),
                                           torch.cat([gate_up_scales[index][0::2], gate_up_scales[index][1::2]])),
                 Mxfp4Rows.from_checkpoint(down[index], down_scales[index]), *_expert_biases(*biases, index))
                for index in range(count)]
    if has(FUSED_GATE_UP):
        gate_up, down = tensor(FUSED_GATE_UP), tensor(FUSED_DOWN)
        if family.expert_clamp is None:  # [E, 2F, D], [E, D, F]
            return [(gate_up[index], down[index], None, None) for index in range(count)]
        biases = tensor(FUSED_GATE_UP + FUSED_BIAS), tensor(FUSED_DOWN + FUSED_BIAS)  # [E, 2F], [E, D]
        return [(torch.cat([gate_up[index][:, 0::2], gate_up[index][:, 1::2]], dim=1).t().contiguous(),  # gpt-oss's
                 down[index].t().contiguous(), *_expert_biases(*biases, index))
                for index in range(count)]

    def optional(name: str) -> Any:
        return tensor(name) if has(name) else None

    parts = []
    for index in range(count):
        gate, up, down = (f"mlp.experts.{index}.{name}_proj." for name in ("gate", "up", "down"))
        gate_up_bias = torch.cat([tensor(gate + "bias"), tensor(up + "bias")]) if has(gate + "bias") else None
        parts.append((rows([gate + "weight", up + "weight"]), tensor(down + "weight"), gate_up_bias,
                      optional(down + "bias")))
    return parts


def _expert_biases(gate_up_bias: torch.Tensor, down_bias: torch.Tensor, index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Expert ``index``'s gate and up biases, gate's first [2F], and its down bias [D], from gpt-oss's stacked
    ``gate_up_proj_bias`` [E, 2F] (gate's and up's interleaved) and ``down_proj_bias`` [E, D]."""
    return torch.cat([gate_up_bias[index][0::2], gate_up_bias[index][1::2]]), down_bias[index]

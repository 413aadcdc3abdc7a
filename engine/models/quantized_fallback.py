"""The quantized transformers fallback: a model the fast path does not run, built by transformers with its linear
layers packed into Hearth's int4 or int8 as they are read (engine thread: the loader thread while it loads).

transformers' own loader would hold the whole model in fp32 first (and for a GGUF file, the whole file dequantized
besides). Here the model is built on the meta device (``accelerate.init_empty_weights``: parameters take no memory;
buffers such as rotary tables are real), and the tensors stream in one at a time, from a safetensors folder
(``SafetensorsState``) or a GGUF file (read block by block, ``gguf_direct.read_blocks``; named as transformers names
them, with its ``get_gguf_hf_weights_map`` and the architecture's ``TensorProcessor``). Each lands as it comes
(``ModelFiller``):

* an ``nn.Linear``'s weight is packed at once into a ``PackedLinear`` (``packed_linear``) in the plan's ``layers``
  format (the output layer in its ``output_layer`` format): int4 groups of 32 on Hearth's kernel, falling back to int8
  where a layer's shape does not split so (``quant_int.pack_quantized``). A GGUF file's 4-bit blocks become the
  groups as they are (exact, up to the bf16 rounding of each group's scale and zero); its 5-, 6- and 8-bit blocks
  are requantized straight into groups; other types are decoded to fp32 one tensor at a time.
* an ``nn.Embedding``'s table is kept in bf16 (``TableEmbedding``); a tied output layer is packed from the same
  tensor before that. A GGUF file's table, and its output layer where that is not in the layers' format, are
  decoded a few rows at a time as they are packed (``RowChunks``).
* every other tensor (norms, biases, anything not a linear layer, such as GPT-2's ``Conv1D``) is kept in fp32.

So the load holds the packed model and one tensor on its way (with its fp32 temporaries), never the fp32 model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch
from torch import nn

from engine.forward.packed_linear import PackedLinear, TableEmbedding
from engine.forward.weights.gguf_blocks import dense, requantized_groups
from engine.forward.weights.gguf_codes import row_width
from engine.forward.weights.quant_int import Int4Groups
from engine.forward.weights.row_chunks import RowChunks
from engine.host.allocator import return_freed_memory
from engine.models.format_plan import FormatPlan
from engine.models.gguf_check import GGUFContents
from engine.models.gguf_direct import read_blocks
from engine.models.model_source import ModelFileError
from engine.models.safetensors_state import SafetensorsState

Progress = Callable[[int, int], None]  # (tensors done, tensors in all)
Weight = torch.Tensor | Int4Groups | RowChunks


def fallback_notice(formats: FormatPlan, model: nn.Module) -> str:
    """The load notice saying this is not the fast path, and what the fallback holds."""
    packed = sum(1 for module in model.modules() if isinstance(module, PackedLinear))
    return (f"Quantized transformers fallback ({formats.layers}): {type(model).__name__} has no fast path in Hearth, so "
            f"transformers runs it with its {packed} linear layers in {formats.layers} on "
            f"Hearth's kernels (the output layer in {formats.output_layer}), token tables in bf16, the rest in fp32.")


def empty_model(config: Any) -> nn.Module:
    """transformers' model of ``config`` with its parameters on the meta device (no memory), its buffers real."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, trust_remote_code=False)
    return model.eval()


def load_folder(folder: Path, config: Any, formats: FormatPlan, report: Progress) -> nn.Module:
    """A safetensors folder's model in the fallback's formats, one tensor read at a time."""
    model = empty_model(config)
    filler = ModelFiller(model, formats)
    state = SafetensorsState(folder, report)
    for name in state:
        target = filler.target_name(name)
        if target is not None:
            filler.place(target, state[name])
    return filler.finished()


def load_gguf(path: Path, contents: GGUFContents, formats: FormatPlan, report: Progress) -> nn.Module:
    """A GGUF file's model in the fallback's formats, one tensor read and decoded at a time."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name, trust_remote_code=False)
    model = empty_model(config)
    filler = ModelFiller(model, formats)
    for index, (name, weight) in enumerate(gguf_tensors(path, contents, model, filler), start=1):
        filler.place(name, weight)
        report(index, len(contents.tensors))
    return filler.finished()


def gguf_tensors(path: Path, contents: GGUFContents, model: nn.Module,
                 filler: ModelFiller) -> Iterator[tuple[str, Weight]]:
    """The file's tensors under ``model``'s names as transformers maps them, each decoded when reached.

    Where the architecture's processor leaves a matrix as it is: int4 groups where ``filler`` packs it into int4 (a
    4-bit type's as they are, others requantized a chunk of rows at a time), ``RowChunks`` for a token table or an
    output layer apart from the layers' format (decoded a few rows at a time where packed: a large vocabulary's table
    is never whole in fp32). Anything else in fp32, through that processor (which may reorder or reshape it, as
    transformers' own loader does)."""
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor, get_gguf_hf_weights_map

    architecture = contents.metadata["general.architecture"]
    processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=model.config.to_dict())
    as_is = type(processor).process is TensorProcessor.process
    mapping = get_gguf_hf_weights_map(model, processor)
    for info in contents.tensors:
        return_freed_memory()  # the previous tensor's temporaries, before this one's
        blocks = read_blocks(path, contents.data_start, info)  # [rows, bytes per row]
        name = mapping.get(info.name)
        matrix = as_is and name is not None and len(info.dims) == 2
        if matrix and filler.packs_int4(name):
            yield name, requantized_groups(blocks, info.quant_type, cpu_layout=True)
            continue
        if matrix and filler.takes_row_chunks(name):
            yield name, RowChunks(blocks.shape[0], row_width(blocks, info.quant_type),
                                  lambda start, end, rows=blocks, kind=info.quant_type: dense(rows[start:end], kind))
            continue
        parsed: dict[str, Any] = {"tensors": {}}  # where a processor puts tensors it splits (experts)
        result = processor.process(weights=dense(blocks, info.quant_type).reshape(info.shape).numpy(),
                                   name=info.name, tensor_key_mapping=mapping, parsed_parameters=parsed)
        if result.name in mapping:
            yield mapping[result.name], torch.from_numpy(np.ascontiguousarray(result.weights))
        yield from ((name, torch.as_tensor(weight)) for name, weight in parsed["tensors"].items())


class ModelFiller:
    """Puts each tensor of a file into an empty model (``empty_model``) as it comes (the module docstring)."""

    def __init__(self, model: nn.Module, formats: FormatPlan) -> None:
        self.model, self.formats = model, formats
        self._names = {name for name, _ in model.named_parameters(remove_duplicate=False)}
        self._names |= {name for name, _ in model.named_buffers()}
        self._head = _module_name(model, model.get_output_embeddings())
        self._table = _module_name(model, model.get_input_embeddings())
        self._head_tied = bool(self._head and getattr(model.config, "tie_word_embeddings", False))
        self._head_read = False

    def target_name(self, name: str) -> str | None:
        """``name`` (a file's) as the model names it, with or without the base model's prefix; None where the model
        has no such tensor (the file's extras: transformers ignores them too)."""
        prefix = f"{getattr(self.model, 'base_model_prefix', '')}."
        for candidate in (name, prefix + name, name.removeprefix(prefix)):
            if candidate in self._names:
                return candidate
        return None

    def packs_int4(self, name: str) -> bool:
        """Whether ``name`` is a linear layer's weight that the plan packs into int4."""
        module_name, _, attribute = name.rpartition(".")
        linear = isinstance(self._module(module_name), nn.Linear)
        return attribute == "weight" and linear and self._format_of(module_name) == "int4"

    def takes_row_chunks(self, name: str) -> bool:
        """Whether ``name`` may come as ``RowChunks``: the token table (kept in bf16), or the output layer where its
        format is not the layers' (the int8 kernel's, or two int4 planes: both pack a few rows at a time)."""
        module_name, _, attribute = name.rpartition(".")
        head_apart = module_name == self._head and self.formats.output_layer != self.formats.layers
        return attribute == "weight" and (module_name == self._table or head_apart)

    def place(self, name: str, weight: Weight) -> None:
        """Put ``weight`` where ``name`` says: packed, in bf16, or in fp32 (the module docstring)."""
        module_name, _, attribute = name.rpartition(".")
        module = self._module(module_name)
        if isinstance(module, (nn.Linear, PackedLinear)) and attribute == "weight":
            self._head_read |= module_name == self._head
            self._pack(module_name, module, weight)
        elif isinstance(module, nn.Embedding) and attribute == "weight":
            if module_name == self._table and self._head_tied and not self._head_read:
                self._pack(self._head, self._module(self._head), weight)  # before the file's own head, if it has one
            self._replace(module_name, TableEmbedding(weight, module.padding_idx))
        else:
            _set_tensor(module, attribute, weight)

    def finished(self) -> nn.Module:
        """The model, once every parameter has come from the file; a ``ModelFileError`` naming those that did not."""
        missing = [name for name, tensor in self.model.named_parameters() if tensor.is_meta]
        missing += [name for name, tensor in self.model.named_buffers() if tensor.is_meta]
        if missing:
            raise ModelFileError(
                f"The model's files lack {len(missing)} of the tensors transformers' {type(self.model).__name__} "
                f"needs (such as {', '.join(missing[:3])}). Download the model again.")
        return_freed_memory()
        return self.model

    def _format_of(self, module_name: str) -> str:
        """The plan's format for the linear layer ``module_name``: the output layer's, or the layers'."""
        return self.formats.output_layer if module_name == self._head else self.formats.layers

    def _pack(self, module_name: str, module: nn.Module, weight: Weight) -> None:
        bias = module.bias if module.bias is not None and not module.bias.is_meta else None
        packed = PackedLinear(weight, self._format_of(module_name), bias)
        if module.bias is not None and bias is None:
            packed.bias = module.bias  # still on the meta device: the file's bias comes later
        self._replace(module_name, packed)

    def _module(self, name: str) -> nn.Module:
        return self.model.get_submodule(name)

    def _replace(self, name: str, module: nn.Module) -> None:
        parent_name, _, child = name.rpartition(".")
        setattr(self._module(parent_name), child, module)


def _set_tensor(module: nn.Module, attribute: str, tensor: torch.Tensor) -> None:
    """``module``'s parameter or buffer ``attribute`` as ``tensor`` in fp32 (integer and bool buffers as they are)."""
    value = tensor.float() if tensor.is_floating_point() else tensor
    if attribute in module._parameters:
        module._parameters[attribute] = nn.Parameter(value, requires_grad=False)
    else:
        module._buffers[attribute] = value


def _module_name(model: nn.Module, module: nn.Module | None) -> str | None:
    return next((name for name, candidate in model.named_modules() if candidate is module), None) if module else None


def packed_bytes(model: nn.Module) -> int:
    """What the model's packed linear layers hold (beside its parameters and buffers, which ``loading.weight_bytes``
    counts)."""
    return sum(module.nbytes for module in model.modules() if isinstance(module, PackedLinear))

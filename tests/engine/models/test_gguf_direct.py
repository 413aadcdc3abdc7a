"""GGUF files opened directly answer as transformers' own GGUF load does, without a converted copy.

Random files in K-quant and 4-bit types (``random_gguf``), small enough for the CPU: the fast path's
logits from the file as it is, against transformers' model of the same file (which dequantizes it
into fp32 itself), in fp32 and with the 4-bit groups packed as they are.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf.constants import GGMLQuantizationType as Q
from gguf.constants import LlamaFileType

from engine.chat.chat_template import ChatTemplate
from engine.forward.weights.quant import few_rows
from engine.forward.weights.quant_int import INT4_PAIR, Int4Groups, Int4Pair
from engine.forward.weights.row_chunks import RowChunks
from engine.models.gguf_check import read_gguf
from engine.models.gguf_direct import GGUFState, direct_reason, hf_config
from engine.models.loading import LoadPlan, load_model
from engine.models.model_files import inspect_model
from engine.models.model_source import ModelFileError
from tests.engine.forward.batch_of_one import prompt_logits
from tests.engine.models.random_gguf import END_OF_TURN, Shape, write_random_gguf

CPU = torch.device("cpu")
REPO = Path(__file__).resolve().parents[3]
PROMPT = [5, 77, 140, 3, 200, 18, 96, 41]
ARCHITECTURES = ("llama", "qwen2", "qwen3")
# transformers' Qwen3 GGUF config ignores attention.key_length (its default head size is 128): match it
SHAPES = {"qwen3": Shape(heads=2, kv_heads=1)}


def _load(path: Path, precision: str, four_bit_source: bool = False):
    plan = LoadPlan(path, path.stem, CPU, precision, 512, ChatTemplate(None, "test"), four_bit_source=four_bit_source)
    return load_model(plan, lambda *_: None, lambda: False)


def _last_logits(loaded, ids: list[int]) -> torch.Tensor:
    return prompt_logits(loaded.backend, ids)  # [V]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory):
    """For each architecture, a random file and transformers' fp32 model of it."""
    from transformers import AutoModelForCausalLM

    made = {}
    for architecture in ARCHITECTURES:
        folder = tmp_path_factory.mktemp(architecture)
        shape = SHAPES.get(architecture, Shape())
        path = write_random_gguf(folder / f"random-{architecture}.gguf", architecture, shape=shape)
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
        made[architecture] = path, model.eval()
    return made


def _hf_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0, -1]  # [V]


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_fp32_from_the_file_as_it_is_matches_transformers(reference, architecture: str):
    path, hf_model = reference[architecture]
    loaded = _load(path, "fp32")
    assert type(loaded.backend).__name__ == "FastLlamaBackend"
    expected = _hf_logits(hf_model, PROMPT)
    got = _last_logits(loaded, PROMPT)
    assert torch.allclose(got, expected, rtol=1e-3, atol=1e-3 * float(expected.abs().max()))
    assert int(got.argmax()) == int(expected.argmax())


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_4bit_groups_packed_as_they_are_stay_close_to_fp32(reference, architecture: str):
    path, hf_model = reference[architecture]
    four_bit = _load(path, "int4")
    assert four_bit.precision == "int4"
    expected = _hf_logits(hf_model, PROMPT)
    got = _last_logits(four_bit, PROMPT)
    # bf16 activations and scales in the int4 kernel, and the Q6_K down matrices and first v requantized to 4 bits
    assert torch.nn.functional.cosine_similarity(got, expected, dim=0) > 0.98


def test_auto_on_a_4bit_file_keeps_an_fp16_copy_for_prompts_and_4bit_groups_for_decoding(reference):
    path, hf_model = reference["llama"]
    auto = _load(path, "fp16", four_bit_source=True)
    assert auto.precision_label == "fp16 weights, int4 copy for decoding"
    long_prompt = (PROMPT * 10)[: few_rows() + 1]
    prompt_logits = _last_logits(auto, long_prompt)  # more rows than a decode step's: the fp16 copy
    one_row = _last_logits(auto, PROMPT[:1])  # one row: the 4-bit groups
    assert torch.nn.functional.cosine_similarity(prompt_logits, _hf_logits(hf_model, long_prompt), dim=0) > 0.999
    assert torch.nn.functional.cosine_similarity(one_row, _hf_logits(hf_model, PROMPT[:1]), dim=0) > 0.99


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_auto_on_a_q8_0_file_runs_from_its_own_blocks(tmp_path: Path, architecture: str):
    """llama.cpp's Q8_0 file type: where Hearth's prompt kernels run, the file's blocks alone take the prompts and
    the decode steps (a third of the bytes of fp16 beside an int8 copy); elsewhere fp16 weights take the prompts and
    the blocks are the decode steps' copy (with Hearth's kernels). Prompt chunks (one activation code a value) and
    single rows answer as transformers' model of the file (Qwen's q and k rows reordered for the rotary pairs, its
    q/k/v biases beside them)."""
    from transformers import AutoModelForCausalLM

    from engine.forward.native.activation_codes import MANY_ROWS
    from engine.forward.native.support import has_prompt_kernel, may_run
    from engine.models.model_open import open_model
    from engine.protocol.messages import LoadOptions

    path = write_random_gguf(tmp_path / "random-q8_0.gguf", architecture, Q.Q8_0, SHAPES.get(architecture, Shape()),
                             six_bit_down=False, file_type=LlamaFileType.MOSTLY_Q8_0)
    hf_model = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=path.name, dtype=torch.float32).eval()
    auto = open_model(str(path), LoadOptions("cpu", "auto"), lambda _: None, lambda *_: None, lambda: False)
    copy = ", int8 copy for decoding" if may_run() else ""
    assert auto.precision_label == ("int8 weights" if has_prompt_kernel() else f"fp16 weights{copy}")
    for ids in ((PROMPT * 20)[:MANY_ROWS + 1], (PROMPT * 10)[: few_rows() + 1], PROMPT[:1]):
        similarity = torch.nn.functional.cosine_similarity(_last_logits(auto, ids), _hf_logits(hf_model, ids), dim=0)
        assert similarity > 0.999, len(ids)


def test_config_tokenizer_and_end_tokens_come_from_the_metadata(reference):
    path, hf_model = reference["llama"]
    loaded = _load(path, "fp32")
    config = loaded.model.config
    for name in ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "vocab_size"):
        assert getattr(config, name) == getattr(hf_model.config, name), name
    end = loaded.tokenizer.convert_tokens_to_ids(END_OF_TURN)
    assert loaded.eos_ids == {end}
    assert loaded.tokenize("hi " + END_OF_TURN)[-1] == end


def llama3_rope_factors(theta: float, head_dim: int, factor: float, low: float, high: float, original: int):
    """What llama.cpp's converter writes as ``rope_freqs.weight`` for Llama 3.1's rope scaling."""
    import math

    factors = []
    for freq in 1.0 / theta ** (np.arange(0, head_dim, 2) / head_dim):
        wavelength = 2 * math.pi / freq
        if wavelength < original / high:
            factors.append(1.0)
        elif wavelength > original / low:
            factors.append(factor)
        else:
            smooth = (original / wavelength - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(factors)


def test_llama_3_rope_scaling_from_the_files_frequency_factors(tmp_path: Path):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    shape = Shape()
    rope = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    factors = llama3_rope_factors(10000.0, shape.head_dim, 8.0, 1.0, 4.0, 64)
    loaded = _load(write_random_gguf(tmp_path / "llama3.gguf", rope_factors=factors), "fp32")
    config = LlamaConfig(hidden_size=shape.hidden, num_attention_heads=shape.heads, rope_parameters=rope)
    cos, sin = LlamaRotaryEmbedding(config)(torch.zeros(1), torch.arange(300).unsqueeze(0))  # [1, P, hd] each
    half = shape.head_dim // 2
    expected = torch.complex(cos[0, :, :half], sin[0, :, :half])  # [P, hd/2]
    assert torch.allclose(loaded.model.rotations(0, 300)[0][:, 0], expected, atol=1e-5)
    assert not torch.allclose(_load(write_random_gguf(tmp_path / "plain.gguf"), "fp32").model.rotations(0, 300)[0][:, 0],
                              expected, atol=1e-3)  # the factors matter


def test_tensors_are_decoded_only_when_asked_for_and_counted(reference):
    path, _ = reference["llama"]
    contents = read_gguf(path)
    counted: list[tuple[int, int]] = []
    state = GGUFState(path, contents, groups=True, report=lambda done, total: counted.append((done, total)))
    assert "model.layers.0.self_attn.q_proj.weight" in state and not counted  # a membership test decodes nothing
    state["model.layers.0.self_attn.q_proj.weight"]
    assert counted == [(1, len(state))]
    assert direct_reason(contents) is None and hf_config(contents).model_type == "llama"


def test_every_matrix_comes_in_4bit_groups_and_the_output_layer_as_the_cpu_head_asks(reference):
    """4-bit alone: on a GPU the head stays one plane of groups, made a few rows at a time, so host memory never
    holds it in fp32; on the CPU two planes, or for the int8 kernel the file's rows decoded exactly where packed,
    from blocks of their own that later reads leave alone."""
    path, _ = reference["llama"]
    contents = read_gguf(path)
    head, layer = "model.embed_tokens.weight", "model.layers.0.mlp.down_proj.weight"  # tied: the Q8_0 table

    def state(table_format: str | None) -> GGUFState:
        return GGUFState(path, contents, groups=True, report=lambda *_: None, all_groups=True,
                         table_format=table_format)

    gpu_like, paired, chunked = state(None), state(INT4_PAIR), state("int8")
    assert isinstance(gpu_like[head], Int4Groups) and isinstance(gpu_like[layer], Int4Groups)
    assert isinstance(paired[head], Int4Pair) and isinstance(paired[layer], Int4Groups)
    exact = GGUFState(path, contents, groups=False, report=lambda *_: None)[head]  # [V, D] fp32
    one_plane, two_planes = gpu_like[head].dequantize() - exact, paired[head].dequantize() - exact
    assert two_planes.abs().max() < one_plane.abs().max() / 10
    rows = chunked[head]
    assert isinstance(rows, RowChunks) and rows.shape == exact.shape
    chunked[layer]  # a later read, into the reused buffer
    assert torch.equal(rows[3:70], exact[3:70]) and torch.equal(rows.dequantize(), exact)


def test_a_tensor_stays_as_read_while_later_ones_reuse_the_read_buffer(reference):
    path, _ = reference["llama"]
    contents = read_gguf(path)
    names = sorted(GGUFState(path, contents, groups=False, report=lambda *_: None))
    in_turn = GGUFState(path, contents, groups=False, report=lambda *_: None)
    kept = {name: in_turn[name] for name in names}  # every read after the first reuses the buffer
    for name in names:
        alone = GGUFState(path, contents, groups=False, report=lambda *_: None)[name]
        assert torch.equal(kept[name], alone), name


def test_a_file_in_a_type_hearth_cannot_read_is_refused_by_name(tmp_path: Path):
    import gguf

    path = tmp_path / "iq.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("blk.0.attn_q.weight", np.zeros((256, 66), dtype=np.uint8), raw_dtype=Q.IQ2_XXS)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelFileError, match="IQ2_XXS, which Hearth cannot read"):
        inspect_model(path)


def test_converted_copies_of_earlier_versions_are_removed_once_with_a_notice(tmp_path: Path, monkeypatch):
    from engine.models.model_open import remove_converted_copies

    monkeypatch.setenv("HEARTH_HOME", str(tmp_path))
    old = tmp_path / "cache" / "models" / "converted" / "SmolLM2-1234-v1"
    old.mkdir(parents=True)
    (old / "model.safetensors").write_bytes(bytes(3 * 1024**2))
    (notice,) = remove_converted_copies()
    assert "3 MB" in notice and "read as they are" in notice
    assert not old.parent.exists()
    assert remove_converted_copies() == ()


def test_a_direct_load_imports_none_of_transformers_modelling_code(reference):
    """The config and the rotary frequencies come without transformers' model classes, whose import took
    ~2.7 s and ~140 MB of the built-in model's load."""
    path, _ = reference["llama"]
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from tests.engine.models.test_gguf_direct import _load\n"
        f"loaded = _load(Path({str(path)!r}), 'fp16', four_bit_source=True)\n"
        "from tests.engine.forward.batch_of_one import prompt_logits\n"
        "assert prompt_logits(loaded.backend, [5, 77]).isfinite().all()\n"
        "print(sorted(m for m in sys.modules if m == 'transformers.modeling_utils' or m.startswith('transformers.models.')\n"
        "             and m.rsplit('.', 1)[-1].startswith(('modeling_', 'configuration_'))))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("architecture", ["gemma2", "gemma3", "phi3"])
def test_a_sentencepiece_vocabulary_of_gemma_and_phi3_files_loads_as_their_tokenizer(tmp_path: Path, architecture: str):
    """Gemma's and Phi-3's files hold a sentencepiece vocabulary (``tokenizer.ggml.model`` "llama"), which
    transformers builds per architecture; Phi-4-mini's is byte-level BPE, as the other tests' files."""
    import gguf

    from engine.models.gguf_direct import load_tokenizer

    pieces = ["<unk>", "<s>", "</s>", "<end_of_turn>", "\u2581", "\u2581h", "\u2581hi", "h", "i", "!"]
    pieces += [f"<0x{byte:02X}>" for byte in range(256)]
    types = [2, 3, 3, 3] + [1] * 6 + [6] * 256  # unknown, control, normal and byte pieces
    path = tmp_path / f"{architecture}.gguf"
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(pieces)
    writer.add_token_scores([0.0, 0.0, 0.0, 0.0, -1.0, -2.0, -0.5, -3.0, -3.0, -3.0] + [-10.0] * 256)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(3)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tokenizer = load_tokenizer(path)
    text = "hi!" if architecture == "phi3" else " hi!"  # Phi-3's vocabulary adds a prefix space, Gemma's does not
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.convert_ids_to_tokens(ids) == ["\u2581hi", "!"]
    assert tokenizer.decode(ids) == text
    assert tokenizer.eos_token == "<end_of_turn>"


@pytest.mark.parametrize("architecture, layers, hidden, heads, head_dim, scalar, full_layers", [
    ("gemma3", 26, 1152, 4, 256, 256, [5, 11, 17, 23]),  # Gemma 3 1B: five sliding layers to a full one
    ("gemma3", 62, 5376, 32, 128, 168, [5, 11, 17, 23, 29, 35, 41, 47, 53, 59]),  # 27B: hidden / heads
    ("gemma2", 46, 4608, 32, 128, 144, list(range(1, 46, 2))),  # Gemma 2 27B: sliding and full in turn
])
def test_gemma_configs_from_the_metadata_follow_llama_cpp(tmp_path: Path, architecture: str, layers: int,
                                                          hidden: int, heads: int, head_dim: int, scalar: int,
                                                          full_layers: list[int]):
    """The files state neither the attention scale nor which layers slide: llama.cpp's rules give them."""
    import gguf

    path = tmp_path / f"{architecture}.gguf"
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_block_count(layers)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(4 * hidden)
    writer.add_head_count(heads)
    writer.add_head_count_kv(heads // 2)
    writer.add_key_length(head_dim)
    writer.add_sliding_window(4096)
    writer.add_rope_freq_base(1_000_000.0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    config = hf_config(read_gguf(path))
    assert config.query_pre_attn_scalar == scalar and config.hidden_activation == "gelu_pytorch_tanh"
    assert [i for i, kind in enumerate(config.layer_types) if kind == "full_attention"] == full_layers
    if architecture == "gemma3":
        assert config.rope_parameters["sliding_attention"]["rope_theta"] == 10000.0
        assert config.rope_parameters["full_attention"]["rope_theta"] == 1_000_000.0

"""Build the tiny model the local fleet serves with the real vLLM engine, without a
network: a Llama-architecture model with random weights (4 layers, hidden size 128,
about 1.1 M parameters, 4.5 MB in float32) and a byte-level BPE tokenizer trained on
the text of a few of Python's own modules, with a chat template so the chat route works.

Its answers are noise; what matters is that it is a real Hugging Face checkpoint that
vLLM loads, shards by pipeline stage and serves with its real API server, exactly as
it would a 70B model (the layer count is what PP splits).

Its weights are split as a large model's are (`model-0000K-of-0000N.safetensors` and
`model.safetensors.index.json`, the layout transformers' save_pretrained writes when it
shards), one file per part a pipeline stage may or may not hold, so that the stages
need different files:
    model-00001-of-00006.safetensors   model.embed_tokens.weight
    model-00002-of-00006.safetensors   model.layers.0.*
    ...
    model-00005-of-00006.safetensors   model.layers.3.*
    model-00006-of-00006.safetensors   model.norm.weight
The word embeddings are tied (tie_word_embeddings): there is no lm_head.weight, and the
last stage builds its embedding too (vllm/model_executor/models/llama.py, LlamaModel:
`embed_tokens` on the first rank "or (config.tie_word_embeddings and
get_pp_group().is_last_rank)"), so it also needs the first file.

Run with the fleet's virtualenv (it has torch, transformers and tokenizers):
    <venv>/bin/python tests/tiny_model.py OUT_DIR
The output is the same for the same sources (fixed seed, fixed training text).
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

LAYERS = 4
HIDDEN = 128
INTERMEDIATE = 256
HEADS = 4
KV_HEADS = 2
VOCAB = 4096
CONTEXT = 4096
SPECIAL_TOKENS = ["<s>", "</s>", "<pad>"]
# The weight files: the embedding, one per decoder layer, the final norm.
SHARDS = LAYERS + 2
INDEX = "model.safetensors.index.json"  # transformers' SAFE_WEIGHTS_INDEX_NAME
SINGLE_FILE = "model.safetensors"  # what save_pretrained writes for a model this small
# A plain role-tagged template: enough for /v1/chat/completions to render a prompt.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


# Local, fixed for a Python version, a few hundred KB of English and code.
TRAINING_MODULES = ("argparse", "textwrap", "json.decoder", "json.encoder", "http.client", "unittest.case")


def training_text() -> list[str]:
    import importlib
    import inspect

    return [inspect.getsource(importlib.import_module(name)) for name in TRAINING_MODULES]


def build_tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(training_text(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", pad_token="<pad>", model_max_length=CONTEXT
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)


def build_model(out: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=CONTEXT,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
        tie_word_embeddings=True,
        dtype="float32",
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(out, safe_serialization=True)
    # transformers keeps a model under its max_shard_size ("50GB", modeling_utils.py
    # save_pretrained in 5.19) in one file: split that
    # file's tensors, as they are, into the files a large model comes in.
    shard(out)


def shard_file(index: int) -> str:
    """The name of weight file `index` (0-based), as transformers names shards
    (modeling_utils.save_pretrained: "model{suffix}.safetensors", suffix "-00001-of-00006")."""
    return f"model-{index + 1:05d}-of-{SHARDS:05d}.safetensors"


def shard_of(name: str) -> str:
    """The weight file a tensor goes to: the embedding first, then one per decoder layer
    in order, the final norm last."""
    if name == "model.embed_tokens.weight":
        return shard_file(0)
    if name == "model.norm.weight":
        return shard_file(SHARDS - 1)
    layer = re.fullmatch(r"model\.layers\.(\d+)\..+", name)
    if layer is None or int(layer.group(1)) >= LAYERS:
        raise ValueError(f"no weight file for tensor {name!r}: the tiny model's layout does not know it")
    return shard_file(1 + int(layer.group(1)))


def shard(out: Path) -> None:
    """Replace out/model.safetensors with the shard files and their index."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    single = out / SINGLE_FILE
    with safe_open(single, framework="pt") as weights:
        metadata = weights.metadata()  # {"format": "pt"}, kept in every shard as transformers does
        tensors = {name: weights.get_tensor(name) for name in weights.keys()}
    files: dict[str, dict] = {}
    for name, tensor in tensors.items():
        files.setdefault(shard_of(name), {})[name] = tensor
    if sorted(files) != [shard_file(i) for i in range(SHARDS)]:
        raise ValueError(f"expected {SHARDS} weight files, the tensors fill {sorted(files)}")
    for file, part in sorted(files.items()):
        save_file(part, out / file, metadata=metadata)
        os.chmod(out / file, 0o644)
    # The index as transformers writes it (modeling_utils.save_pretrained): total_size is
    # the tensors' bytes (huggingface_hub split_torch_state_dict_into_shards), sorted keys.
    index = {
        "metadata": {
            "total_parameters": sum(t.numel() for t in tensors.values()),
            "total_size": sum(t.numel() * t.element_size() for t in tensors.values()),
        },
        "weight_map": {name: shard_of(name) for name in sorted(tensors)},
    }
    (out / INDEX).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    single.unlink()


def main(argv: list[str]) -> int:
    out = Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    build_tokenizer(out)
    build_model(out)
    files = sorted(p.name for p in out.iterdir())
    json.dump({"files": files}, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

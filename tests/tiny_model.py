"""Build the tiny model the local fleet serves with the real vLLM engine, without a
network: a Llama-architecture model with random weights (4 layers, hidden size 128,
about 1.1 M parameters, 4.5 MB in float32) and a byte-level BPE tokenizer trained on
the text of a few of Python's own modules, with a chat template so the chat route works.

Its answers are noise; what matters is that it is a real Hugging Face checkpoint that
vLLM loads, shards by pipeline stage and serves with its real API server, exactly as
it would a 70B model (the layer count is what PP splits).

Run with the fleet's virtualenv (it has torch, transformers and tokenizers):
    <venv>/bin/python tests/tiny_model.py OUT_DIR
The output is the same for the same sources (fixed seed, fixed training text).
"""

from __future__ import annotations

import json
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

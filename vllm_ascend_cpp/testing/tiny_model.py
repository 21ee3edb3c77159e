"""A tiny Llama checkpoint directory for demos and tests: a config and nothing to download.

vLLM builds the model from `config.json` and fills it with dummy weights when started with
`load_format="dummy"`, so no hub and no real weights are needed. `with_tokenizer=True` also
writes a small word-level tokenizer built with the `tokenizers` library, so text prompts, the
OpenAI server and `vllm bench serve` work offline.
"""

from __future__ import annotations

import json
from pathlib import Path

# Small enough that a 12k-token prefill takes well under a second per stage on 2 CPU cores,
# large enough that attention is a visible share of a long chunk's cost.
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "head_dim": 64,
    "vocab_size": 2048,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def write_tiny_llama(
    path: str | Path,
    *,
    overrides: dict | None = None,
    with_tokenizer: bool = False,
) -> Path:
    """Write the config (and optionally a tokenizer) to `path`; return the directory."""
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    config = dict(TINY_LLAMA)
    config.update(overrides or {})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    if with_tokenizer:
        _write_tokenizer(out, int(config["vocab_size"]))
    return out


def _write_tokenizer(out: Path, vocab_size: int) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    specials = ["<unk>", "<s>", "</s>"]
    words = [f"w{i}" for i in range(vocab_size - len(specials))]
    vocab = {tok: i for i, tok in enumerate(specials + words)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    # Split on whitespace only: "<unk>" and "</s>" then round-trip through decode and encode as
    # one token each, so a prompt's token count is what a client (or `vllm bench serve`) built.
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "model_max_length": 1 << 20,
                "chat_template": "{% for m in messages %}{{ m['content'] }} {% endfor %}",
            },
            indent=2,
        )
    )

"""Tiny random models and a tiny tokenizer for tests: offline, deterministic, a few MB.

The tokenizer is a byte-level BPE trained in well under a second on text this module generates
(chat-template framing, tool-call tags, arithmetic), with ``<|im_start|>``/``<|im_end|>`` as special
tokens so the real chat template renders unchanged. It is cached in ``<cache>/models/tiny-tokenizer``.

``tiny-nemotronh`` follows Nemotron 3 Nano's layout in miniature: Mamba-2 → MoE → attention → MoE,
sigmoid top-k routing with an aux-loss-free correction bias, shared expert, squared-ReLU experts.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Callable

from posttrain.configs import cache_dir

TOKENIZER_VOCAB = 512
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _corpus(n: int = 3000, seed: int = 0) -> list[str]:
    from posttrain.models.chat_template import format_tool_call, render_text

    rng = random.Random(seed)
    words = "the a of to and is what answer reasoning think tool call function parameter user assistant system sum add numbers result value json name city weather email calendar".split()
    out = []
    for _ in range(n):
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        msgs = [
            {"role": "user", "content": f"What is {a} + {b}? " + " ".join(rng.choices(words, k=6))},
            {"role": "assistant", "content": f"<think>\n{a} plus {b} is {a + b}.\n</think>\nAnswer: {a + b}"},
        ]
        out.append(render_text(msgs))
        out.append(format_tool_call(rng.choice(words), {rng.choice(words): rng.randint(0, 99)}))
    return out


def tiny_tokenizer() -> Any:
    from transformers import PreTrainedTokenizerFast

    path = cache_dir() / "models" / "tiny-tokenizer"
    if not (path / "tokenizer.json").exists():
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        tk = Tokenizer(models.BPE())
        tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tk.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=TOKENIZER_VOCAB,
            special_tokens=SPECIAL_TOKENS,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        )
        tk.train_from_iterator(_corpus(), trainer)
        fast = PreTrainedTokenizerFast(
            tokenizer_object=tk, bos_token="<|im_start|>", eos_token="<|im_end|>",
            pad_token="<|endoftext|>", unk_token="<|endoftext|>",
        )
        tmp = path.with_name(path.name + f".tmp{random.randrange(1 << 30)}")
        fast.save_pretrained(tmp)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            tmp.rename(path)
        except OSError:  # another process won the race; theirs is identical
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    return PreTrainedTokenizerFast.from_pretrained(path)


def _llama(vocab_size: int) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
        tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )


def _nemotron_h(vocab_size: int) -> Any:
    from transformers import NemotronHConfig

    return NemotronHConfig(
        vocab_size=vocab_size, hidden_size=64,
        layers_block_type=["linear_attention", "moe", "full_attention", "moe"],
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=128,
        ssm_state_size=16, mamba_num_heads=8, mamba_head_dim=16, n_groups=2, chunk_size=16,
        n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        moe_shared_expert_intermediate_size=32, max_position_embeddings=2048,
        bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False,
    )


TINY_MODELS: dict[str, Callable[[int], Any]] = {"tiny-llama": _llama, "tiny-nemotronh": _nemotron_h}


def build_tiny(name: str, vocab_size: int = TOKENIZER_VOCAB, seed: int = 0) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    cfg = TINY_MODELS[name](vocab_size)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(cfg)
        if hasattr(model, "model") and name == "tiny-nemotronh":
            # the router weight starts at zeros in the module; give it signal so routing varies
            for mod in model.modules():
                if hasattr(mod, "e_score_correction_bias"):
                    torch.nn.init.normal_(mod.weight, std=0.5)
    return model


def tiny_dir(name: str, root: Path | None = None, seed: int = 0) -> Path:
    """Save a tiny model + tokenizer as an HF directory (for tests that need a path)."""
    root = root or cache_dir() / "models"
    out = root / f"{name}-seed{seed}"
    if not (out / "config.json").exists():
        tok = tiny_tokenizer()
        model = build_tiny(name, len(tok), seed)
        model.save_pretrained(out)
        tok.save_pretrained(out)
    return out

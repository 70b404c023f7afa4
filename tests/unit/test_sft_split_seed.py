"""``data.split_seed``: the held-out rows stay put while ``train.seed`` moves (bench/prune.py's seeds)."""

from __future__ import annotations

from posttrain.configs.sft import SFTConfig
from posttrain.data.conversations import write_jsonl
from posttrain.data.synthetic import arithmetic_rows
from posttrain.models.loading import load_tokenizer
from posttrain.train.sft import load_sft_data


def _held(path: str, seed: int, split_seed: int | None) -> list[tuple[int, ...]]:
    cfg = SFTConfig(model="tiny-llama", train={"seed": seed},
                    data={"train": [{"path": path}], "val_frac": 0.25, "split_seed": split_seed})
    return [tuple(e.input_ids) for e in load_sft_data(cfg, load_tokenizer("tiny-llama")).validation]


def test_split_seed_fixes_the_held_out_rows_across_training_seeds(tmp_path):
    path = str(tmp_path / "rows.jsonl")
    write_jsonl(arithmetic_rows(40, seed=0, max_digits=2), path)
    fixed = [_held(path, s, split_seed=0) for s in (0, 1, 2)]
    assert fixed[0] == fixed[1] == fixed[2] and len(fixed[0]) == 10
    # unset, the training seed draws the hold-out as it always did: seed 0 the same rows, seed 1 others
    assert _held(path, 0, None) == fixed[0]
    assert set(_held(path, 1, None)) != set(fixed[0])

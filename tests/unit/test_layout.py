"""The code's shape, checked: short functions where the training logic lives, stage entries that fit
one screen, no distillation branches in the loop or the losses, configs importable without torch.

(The import layers are checked by ``lint-imports``, which ``make test`` runs; see pyproject.toml.)
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "posttrain"


def _functions(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node.end_lineno - node.lineno + 1  # type: ignore[operator]


@pytest.mark.parametrize("folder", ["train", "distill", "engines", "episodes", "scorers", "scale"])
def test_no_function_over_80_lines(folder):
    long = [(f.name, name, n) for f in (PKG / folder).glob("*.py") for name, n in _functions(f) if n > 80]
    assert not long, long


@pytest.mark.parametrize("module, entry", [("train/sft.py", "train_sft"), ("train/rl.py", "train_rl"),
                                           ("distill/stage.py", "train_distill"), ("train/dpo.py", "train_dpo"),
                                           ("train/rlhf.py", "train_rlhf"), ("train/rlhf.py", "train_genrm"),
                                           ("compress/distill_logits.py", "train_distill_logits"),
                                           ("compress/search.py", "run_search")])
def test_stage_entries_fit_one_screen(module, entry):
    sizes = dict(_functions(PKG / module))
    assert sizes[entry] <= 60, sizes[entry]


def test_no_distillation_branches_in_the_loop_or_the_losses():
    files = [*sorted((PKG / "train").glob("*.py")), PKG / "algos" / "losses.py"]
    hits = [f"{f.name}:{i}" for f in files for i, line in enumerate(f.read_text().splitlines(), 1)
            if re.search("distill|teacher", line)]
    assert not hits, hits


def test_configs_import_without_torch():
    code = ("import sys; import posttrain.configs.sft, posttrain.configs.rl, posttrain.configs.distill, "
            "posttrain.configs.pipeline, posttrain.configs.plugins, posttrain.configs.rlhf, posttrain.configs.dpo, "
            "posttrain.configs.scale, posttrain.configs.curate, posttrain.configs.prune; "
            "assert 'torch' not in sys.modules, 'configs pulled in torch'")
    subprocess.run([sys.executable, "-c", code], check=True)

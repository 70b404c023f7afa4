"""prune-search's pieces without training: the selection rule on hand-made rows, and the candidate
checks that fail in one line before any weight is read."""

import math

import pytest
from pydantic import ValidationError

from posttrain.compress.search import Scored, SearchError, candidate_sizes, choose
from posttrain.compress.slicing import count_params, new_config
from posttrain.configs.prune import PruneSearchConfig
from posttrain.models.tiny import build_tiny


def cfg(**kw):
    return PruneSearchConfig(**{"params": 80_000, "calibration": {"path": "calib.jsonl"}, **kw})


def test_lowest_loss_wins_when_nothing_ties():
    rows = [Scored("a", 100, 0.50), Scored("b", 120, 0.30), Scored("c", 90, 0.45)]
    assert choose(rows, tie_tolerance=0.01) == 1


def test_a_tie_goes_to_fewer_params_then_faster_decode_then_list_order():
    # best 0.300; b (0.305) and c (0.309) are within 0.01 of it, d (0.311) is not
    rows = [Scored("a", 100, 0.300), Scored("b", 90, 0.305), Scored("c", 90, 0.309), Scored("d", 50, 0.311)]
    assert choose(rows, 0.01) == 1  # b and c have the fewest params among the tied; b comes first
    assert choose(rows, 0.0) == 0  # no tolerance: only the exact minimum
    fast = [Scored("a", 90, 0.30, 100.0), Scored("b", 90, 0.30, 250.0), Scored("c", 90, 0.30, None)]
    assert choose(fast, 0.0) == 1  # same loss and params: the faster decode; unmeasured counts as slowest


def test_non_finite_losses_are_never_chosen():
    assert choose([Scored("a", 10, math.nan), Scored("b", 99, 2.0), Scored("c", 5, math.inf)], 0.5) == 1
    with pytest.raises(SearchError, match="no candidate has a finite"):
        choose([Scored("a", 10, math.nan)], 0.1)


@pytest.mark.parametrize("candidates, words", [
    ([{"axes": ["mlp_hidden", "mlp_hidden"]}], "name an axis twice"),
    ([{"axes": ["layers"]}, {"axes": ["layers"], "name": "depth"}], "cut the same axes"),
    ([{"axes": ["layers"]}, {"axes": ["hidden"], "name": "layers"}], "appears twice"),
    ([{"axes": []}], "at least 1"),
    ([], "at least 1"),
    ([{"axes": ["depth"]}], "'mlp_hidden', 'heads'"),
    ([{"axes": ["layers"], "name": "a/b"}], "pattern"),
])
def test_bad_candidates_are_refused_by_the_config(candidates, words):
    with pytest.raises(ValidationError, match=words):
        cfg(candidates=candidates)


def test_candidate_sizes_meet_the_count_and_name_the_candidate_that_cannot():
    hf = build_tiny("tiny-llama").config
    sizes = candidate_sizes(hf, cfg())
    assert list(sizes) == ["mlp_hidden", "mlp_hidden+heads", "hidden", "layers", "mlp_hidden+layers"]
    for name, s in sizes.items():
        assert count_params(new_config(hf, s, list(range(s.layers)))) <= 80_000, name
    assert sizes["layers"].layers == 1 and sizes["layers"].mlp_hidden == hf.intermediate_size
    assert sizes["hidden"].hidden % 8 == 0 and sizes["hidden"].layers == 2
    with pytest.raises(SearchError, match=r"^candidate heads: params=8e\+04 is out of reach .* candidates\[1\]\.axes$"):
        candidate_sizes(hf, cfg(candidates=[{"axes": ["layers"]}, {"axes": ["heads"]}]))
    with pytest.raises(SearchError, match=r"candidate mamba_heads: candidates\[0\]\.axes: this llama model has no axis"):
        candidate_sizes(hf, cfg(candidates=[{"axes": ["mamba_heads"]}]))

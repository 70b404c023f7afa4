"""bench/distill_logits_defaults.py's pure parts: the paired difference, the rule that keeps or replaces a
default, and the per-conversation NLL, each against values worked out by hand."""

import math

import pytest
import torch

from tests.script_module import script_module


def test_paired_diff_is_the_mean_and_se_of_the_differences():
    with script_module("bench", "distill_logits_defaults") as m:
        # differences 0.1, 0.3, 0.2: mean 0.2, sd 0.1, se 0.1 / sqrt(3)
        mean, se = m.paired_diff([1.1, 2.3, 0.7], [1.0, 2.0, 0.5])
        assert mean == pytest.approx(0.2)
        assert se == pytest.approx(0.1 / math.sqrt(3))
        assert math.isnan(m.paired_diff([1.0], [0.5])[1])  # one pair: no se
        with pytest.raises(ValueError):
            m.paired_diff([1.0, 2.0], [1.0])


def test_over_seeds_averages_each_conversation():
    with script_module("bench", "distill_logits_defaults") as m:
        assert m.over_seeds([[1.0, 2.0], [3.0, 4.0]]) == pytest.approx([2.0, 3.0])


def test_a_setting_replaces_the_default_only_beyond_the_margin():
    with script_module("bench", "distill_logits_defaults") as m:
        base = [1.0, 1.2, 0.8, 1.1]
        # 0.05 lower on every conversation: se 0, margin 0.01 -> better, replaces the default
        low = [x - 0.05 for x in base]
        # 0.005 lower everywhere: inside the 0.01 floor -> equal, the default stays
        tiny = [x - 0.005 for x in base]
        # 0.05 lower on average but differences -0.25, +0.15, -0.15, +0.05: se = sqrt(0.10 / 3 / 4) = 0.091, 2 se = 0.18 -> equal
        noisy = [0.75, 1.35, 0.65, 1.15]
        assert m.choose({"default": base, "low": low}, "default")[0] == "low"
        chosen, table = m.choose({"default": base, "tiny": tiny}, "default")
        assert chosen == "default" and table["tiny"]["verdict"] == "equal"
        chosen, table = m.choose({"default": base, "noisy": noisy}, "default")
        assert table["noisy"]["minus_default"] == pytest.approx(-0.05)
        assert table["noisy"]["se"] == pytest.approx(math.sqrt(0.10 / 3 / 4))
        assert chosen == "default"
        # two winners: the lower NLL; a worse one never
        lower = [x - 0.1 for x in base]
        worse = [x + 0.5 for x in base]
        assert m.choose({"default": base, "low": low, "lower": lower, "worse": worse}, "default")[0] == "lower"


def test_the_cheaper_of_two_equal_settings_wins_where_compute_differs():
    with script_module("bench", "distill_logits_defaults") as m:
        base = [1.0, 1.2, 0.8]
        same = [x + 0.004 for x in base]  # equal by the rule
        # 20 % fewer seconds: cheaper, so it replaces the default; 5 % fewer: within the cost margin
        assert m.choose({"default": base, "topk64": same}, "default", {"default": 100.0, "topk64": 80.0})[0] == "topk64"
        assert m.choose({"default": base, "topk64": same}, "default", {"default": 100.0, "topk64": 95.0})[0] == "default"
        # a clearly worse setting stays out however cheap
        worse = [x + 0.2 for x in base]
        assert m.choose({"default": base, "topk64": worse}, "default", {"default": 100.0, "topk64": 10.0})[0] == "default"


def test_per_row_nll_is_each_conversations_token_mean_by_hand():
    from posttrain.compress.search import heldout_nll
    from posttrain.data.packing import Example
    from posttrain.models.loading import load_model

    loaded = load_model("tiny-llama", device="cpu", dtype=torch.float32)
    model = loaded.model.eval()
    rows = [Example([5, 17, 230, 41, 9, 12], [0, 0, 1, 1, 0, 1]), Example([3, 88, 7, 301], [0, 1, 1, 1])]

    def by_hand(ex):  # -log p(token t | tokens < t), averaged over the positions t whose mask is 1
        with torch.no_grad():
            lp = torch.log_softmax(model(torch.tensor([ex.input_ids])).logits[0].float(), -1)
        terms = [-float(lp[t - 1, ex.input_ids[t]]) for t in range(1, len(ex)) if ex.loss_mask[t]]
        return sum(terms) / len(terms)

    with script_module("bench", "distill_logits_defaults") as m:
        got = m.per_row_nll(model, rows, pad_id=0)
        assert got == pytest.approx([by_hand(r) for r in rows], abs=1e-5)
        assert [m.trained_tokens(r) for r in rows] == [3, 3]
        # pooled over tokens it is the figure compress/search.py's heldout_nll gives (packed rows)
        pooled = m.token_mean(got, [m.trained_tokens(r) for r in rows])
        assert pooled == pytest.approx(heldout_nll(model, rows, 512, "auto", 0), abs=1e-5)


def test_merged_writes_a_setting_over_the_recipe_section_by_section():
    with script_module("bench", "distill_logits_defaults") as m:
        recipe = {"loss": {"temperature": 1.0, "ce_weight": 0.0}, "optim": {"lr": 1e-4}}
        assert m.merged(recipe, m.SETTINGS["T2"]) == {"loss": {"temperature": 2.0, "ce_weight": 0.0},
                                                      "optim": {"lr": 1e-4}}
        assert recipe["loss"]["temperature"] == 1.0  # the recipe itself is untouched

"""``posttrain distill-logits``: the forward-KL loss on 2–3-token vocabularies against hand-computed
values, the config's one-line refusals, and the teacher cache (mismatches refused; cached targets
equal the in-step teacher's)."""

import json
import math
from contextlib import nullcontext

import pytest
import torch

from posttrain.algos.losses import LOSSES, LossInputs, forward_kl, make_loss
from posttrain.configs import ConfigError, load_config
from posttrain.configs.prune import DistillLogitsConfig


def close(actual, expected, atol=1e-5):
    torch.testing.assert_close(torch.as_tensor(actual).float(), torch.as_tensor(expected).float(), atol=atol, rtol=0)


def kd_inputs(logits_BTV, target_BTK, ids_BTK=None, mask=None, logprobs_BT=None):
    B, T, _ = logits_BTV.shape
    mask = torch.ones(B, T, dtype=torch.bool) if mask is None else torch.tensor(mask, dtype=torch.bool)
    lp = torch.zeros(B, T) if logprobs_BT is None else logprobs_BT
    return LossInputs(lp, mask, logits_BTV=logits_BTV, target_logprobs_BTK=target_BTK, target_ids_BTK=ids_BTK)


# --------------------------------------------------------------------------- the loss


def test_registered_under_its_name():
    assert "forward_kl" in LOSSES.names()


def test_kl_is_zero_when_student_equals_teacher():
    logits = torch.tensor([[[1.0, -2.0, 0.5], [0.0, 3.0, -1.0]]])
    for T in (0.5, 1.0, 3.0):
        close(forward_kl(logits, torch.log_softmax(logits, -1), T), [[0.0, 0.0]])
        close(forward_kl(logits, logits, T), [[0.0, 0.0]])  # logits as the target: the same distribution


def test_full_vocab_kl_by_hand():
    # student uniform over 2, teacher (0.75, 0.25): KL = 0.75 ln 1.5 + 0.25 ln 0.5 = 0.130812
    kl = forward_kl(torch.zeros(1, 1, 2), torch.log(torch.tensor([[[0.75, 0.25]]])))
    close(kl, [[0.75 * math.log(1.5) + 0.25 * math.log(0.5)]])
    close(kl, [[0.130812]])


def test_temperature_softens_both_and_scales_by_t_squared():
    # teacher (0.8, 0.2) at T = 2 is ∝ (√0.8, √0.2) = (2/3, 1/3); the uniform student stays uniform:
    # KL = 2/3 ln(4/3) + 1/3 ln(2/3) = 0.056633, loss = T² · KL = 0.226532
    logits = torch.zeros(1, 1, 2, requires_grad=True)
    target = torch.log(torch.tensor([[[0.8, 0.2]]]))
    kl = 2 / 3 * math.log(4 / 3) + 1 / 3 * math.log(2 / 3)
    close(forward_kl(logits, target, 2.0), [[kl]])
    out = make_loss("forward_kl", temperature=2.0)(kd_inputs(logits, target))
    close(out.loss, 4 * kl)
    close(out.loss, 0.226532)
    assert out.metrics["kl"] == pytest.approx(kl, abs=1e-6)  # logged without T²
    # d(T²·KL)/dz = T·(p_student^T − p_teacher^T) = 2·(1/2 − 2/3, 1/2 − 1/3) = (−1/3, 1/3)
    out.loss.backward()
    close(logits.grad, [[[-1 / 3, 1 / 3]]])


def test_topk_renormalises_the_teacher_but_not_the_student():
    # V = 3, uniform student; teacher's top-2 (0.6, 0.2) renormalised to (0.75, 0.25); the student's
    # log-probs at those ids stay ln(1/3): KL = 0.75 ln 2.25 + 0.25 ln 0.75 = 0.536277
    logits = torch.zeros(1, 1, 3)
    kl = forward_kl(logits, torch.log(torch.tensor([[[0.6, 0.2]]])), 1.0, torch.tensor([[[0, 1]]]))
    close(kl, [[0.75 * math.log(2.25) + 0.25 * math.log(0.75)]])
    close(kl, [[0.536277]])
    # the full-vocabulary KL to (0.6, 0.2, 0.2) is another figure: 0.6 ln 1.8 + 0.4 ln 0.6 = 0.148342
    close(forward_kl(logits, torch.log(torch.tensor([[[0.6, 0.2, 0.2]]]))), [[0.148342]])


def test_topk_with_k_equal_to_vocab_is_the_full_kl():
    g = torch.Generator().manual_seed(0)
    student, teacher = torch.randn(2, 3, 7, generator=g), torch.randn(2, 3, 7, generator=g)
    top = torch.log_softmax(teacher, -1).topk(7, dim=-1)
    for T in (1.0, 2.5):
        close(forward_kl(student, top.values, T, top.indices), forward_kl(student, torch.log_softmax(teacher, -1), T))
        full = make_loss("forward_kl", temperature=T)(kd_inputs(student, torch.log_softmax(teacher, -1))).loss
        topk = make_loss("forward_kl", temperature=T)(kd_inputs(student, top.values, top.indices)).loss
        close(full, topk)


def test_topk_at_temperature_is_exact_from_temperature_one_logprobs():
    # the cache holds log-probs at T = 1; softening the top-k by T equals the top-k of the tempered
    # distribution, renormalised
    teacher = torch.tensor([[[2.0, 1.0, -1.0, 0.5]]])
    student = torch.tensor([[[0.3, -0.2, 0.1, 0.0]]])
    top = torch.log_softmax(teacher, -1).topk(2, dim=-1)
    tempered_top = torch.log_softmax(teacher / 3.0, -1).topk(2, dim=-1)
    assert torch.equal(top.indices, tempered_top.indices)
    target = torch.log_softmax(tempered_top.values, -1)  # the tempered top-k, renormalised
    close(torch.log_softmax(top.values / 3.0, -1), target)
    student_at_ids = torch.log_softmax(student / 3.0, -1).gather(-1, top.indices)
    close(forward_kl(student, top.values, 3.0, top.indices), (target.exp() * (target - student_at_ids)).sum(-1))


def test_mask_respected_and_token_mean():
    # token 0: the 0.130812 case; token 1 (masked): anything, even a large KL, changes nothing
    logits = torch.tensor([[[0.0, 0.0], [5.0, -5.0]]], requires_grad=True)
    target = torch.log(torch.tensor([[[0.75, 0.25], [0.01, 0.99]]]))
    out = make_loss("forward_kl")(kd_inputs(logits, target, mask=[[1, 0]]))
    close(out.loss, 0.130812)
    assert out.metrics["kl"] == pytest.approx(0.130812, abs=1e-5)
    out.loss.backward()
    close(logits.grad, [[[-0.25, 0.25], [0.0, 0.0]]])
    # the step's token count divides (gradient accumulation): 2 tokens in the step → half
    x = kd_inputs(logits.detach(), target, mask=[[1, 0]])
    x.num_tokens = 2
    close(make_loss("forward_kl")(x).loss, 0.130812 / 2)


def test_gradient_reaches_the_student_only():
    logits = torch.zeros(1, 1, 2, requires_grad=True)
    target = torch.log(torch.tensor([[[0.75, 0.25]]])).requires_grad_()
    make_loss("forward_kl", temperature=2.0)(kd_inputs(logits, target)).loss.backward()
    assert target.grad is None
    assert logits.grad is not None and logits.grad.abs().sum() > 0


def test_ce_weight_adds_the_data_nll():
    # KL 0.130812 + 0.5 · NLL, the data token's log-prob being ln 0.5 (uniform student): 0.130812 + 0.346574
    logits = torch.zeros(1, 1, 2)
    out = make_loss("forward_kl", ce_weight=0.5)(
        kd_inputs(logits, torch.log(torch.tensor([[[0.75, 0.25]]])), logprobs_BT=torch.log(torch.tensor([[0.5]]))))
    close(out.loss, 0.130812 + 0.5 * math.log(2))
    assert out.metrics["nll"] == pytest.approx(math.log(2), abs=1e-6)


def test_teacher_zero_probability_gives_no_nan():
    kl = forward_kl(torch.zeros(1, 1, 3), torch.tensor([[[0.0, float("-inf"), 0.0]]]))
    close(kl, [[math.log(1.5)]])  # teacher (1/2, 0, 1/2) vs uniform: ln(1.5)


def test_loss_refuses_missing_inputs():
    with pytest.raises(ValueError, match="logits_BTV"):
        make_loss("forward_kl")(LossInputs(torch.zeros(1, 1), torch.ones(1, 1, dtype=torch.bool)))
    with pytest.raises(ValueError, match="K = V"):
        forward_kl(torch.zeros(1, 1, 3), torch.zeros(1, 1, 2))


# --------------------------------------------------------------------------- the config


@pytest.mark.parametrize("override, field", [
    ("teacher.topk=0", "teacher.topk"),
    ("loss.temperature=0", "loss.temperature"),
    ("loss.temperature=-1", "loss.temperature"),
    ("loss.temperature=.inf", "loss.temperature"),
    ("loss.ce_weight=-0.1", "loss.ce_weight"),
    ("teacher.cache=x.safetensors", "teacher.cache needs teacher.topk"),
    ("teacher.temperature=2", "teacher.temperature: unknown field"),
])
def test_config_refuses_in_one_line(override, field):
    with pytest.raises(ConfigError) as e:
        load_config(DistillLogitsConfig, None, [override])
    assert field in str(e.value) and "\n" not in str(e.value)


def test_config_accepts_the_documented_example():
    cfg = load_config(DistillLogitsConfig, None, ["teacher.topk=64", "teacher.cache=c.safetensors",
                                                  "loss.temperature=2", "loss.ce_weight=0.1"])
    assert (cfg.teacher.topk, cfg.loss.temperature, cfg.loss.ce_weight) == (64, 2.0, 0.1)
    from pathlib import Path

    recipe = load_config(DistillLogitsConfig, Path(__file__).parents[2] / "recipes" / "distill_logits.yaml")
    assert recipe.model == "runs/prune/model" and recipe.teacher.topk is None


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    """A tiny Llama directory and a copy whose config says another vocab_size and whose weights are
    garbage: refused from the config alone proves no weight was read."""
    import shutil

    from posttrain.models.tiny import tiny_dir

    root = tmp_path_factory.mktemp("models")
    good = tiny_dir("tiny-llama", root)
    bad = root / "other-vocab"
    shutil.copytree(good, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["vocab_size"] += 8
    (bad / "config.json").write_text(json.dumps(cfg))
    for f in bad.glob("*.safetensors"):
        f.write_bytes(b"not weights")
    return good, bad


def test_vocab_mismatch_refused_before_any_weight_loads(tiny_pair, tmp_path, capsys):
    from posttrain.cli import main

    good, bad = tiny_pair
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"messages": [{"role": "user", "content": "1+1?"},
                                             {"role": "assistant", "content": "Answer: 2"}]}) + "\n")
    for student, teacher in ((good, bad), (bad, good)):
        rc = main(["distill-logits", f"model={student}", f"teacher.model={teacher}", f"data.train=[{{path: {data}}}]",
                   f"run_dir={tmp_path / 'run'}", "--no-progress"])
        err = capsys.readouterr().err.strip()
        assert rc == 2 and "vocab_size" in err and "\n" not in err, err


def test_topk_larger_than_the_vocabulary_refused(tiny_pair):
    from posttrain.compress.distill_logits import VocabMismatch, check_pair

    good, _ = tiny_pair
    cfg = DistillLogitsConfig(model=str(good), teacher={"model": str(good), "topk": 100_000})
    with pytest.raises(VocabMismatch, match="more than the vocabulary"):
        check_pair(cfg)


# --------------------------------------------------------------------------- the teacher cache


@pytest.fixture(scope="module")
def examples():
    from posttrain.data.examples import tokenize_rows
    from posttrain.data.synthetic import arithmetic_rows
    from posttrain.models.tiny import tiny_tokenizer

    rows = list(arithmetic_rows(10, seed=3))
    exs, _ = tokenize_rows(tiny_tokenizer(), rows, 128)
    return exs


@pytest.fixture(scope="module")
def teacher():
    from posttrain.models.loading import load_model

    return load_model("tiny-llama", device="cpu", dtype=torch.float32).model.eval()


def test_cached_targets_equal_the_in_step_teachers(tmp_path, examples, teacher):
    from posttrain.compress.teacher_cache import TeacherCache, build_cache, fingerprint, targets_from_logits
    from posttrain.data.packing import trainable_rows
    from posttrain.train.supervised import target_logits

    splits = {"train.0": examples[:7], "validation": examples[7:]}
    path = build_cache(tmp_path / "c.safetensors", teacher, splits, 5, 128, 0, True, nullcontext,
                       fingerprint("tiny-llama", splits, 5))
    cache = TeacherCache(path)
    # a training step packs its own draw of examples: rows of (6, 1, 3) and (5,), not the cache's rows
    draw = [6, 1, 3, 5]
    for row in trainable_rows([examples[i] for i in draw], 128, 0, pack=True):
        with torch.no_grad():
            lp, ids = targets_from_logits(target_logits(teacher, row.to_tensors())[0], 5)
        c_lp, c_ids = cache.targets([("train.0", draw[m]) for m in row.members])
        assert torch.equal(ids, c_ids)
        close(c_lp, lp)
    lp_v, _ = cache.targets([("validation", 1)])
    assert lp_v.shape == (sum(examples[8].loss_mask[1:]), 5)


def test_cache_for_another_teacher_data_or_k_refused(tmp_path, examples, teacher):
    from posttrain.compress.teacher_cache import CacheMismatch, build_cache, check_cache, fingerprint

    splits = {"train.0": examples[:4], "validation": examples[4:5]}
    meta = fingerprint("tiny-llama", splits, 3)
    path = tmp_path / "c.safetensors"
    assert check_cache(path, meta) is False  # none yet: to be built
    build_cache(path, teacher, splits, 3, 128, 0, True, nullcontext, meta)
    assert check_cache(path, meta) is True
    for want, what in ((fingerprint("tiny-llama", splits, 4), "another k (teacher.topk=3; here 4)"),
                       (fingerprint("tiny-llama", {**splits, "validation": examples[5:6]}, 3), "another data"),
                       (fingerprint("tiny-nemotronh", splits, 3), "another teacher (tiny-llama; here tiny-nemotronh")):
        with pytest.raises(CacheMismatch) as e:
            check_cache(path, want)
        assert what in str(e.value) and "\n" not in str(e.value), str(e.value)
    torn = tmp_path / "torn.safetensors"
    torn.write_bytes(path.read_bytes()[:40])
    with pytest.raises(CacheMismatch, match="not a readable teacher cache"):
        check_cache(torn, meta)


def test_teacher_fingerprint_follows_the_weights(tmp_path):
    from posttrain.compress.teacher_cache import teacher_fingerprint
    from posttrain.models.tiny import tiny_dir

    a, b = tiny_dir("tiny-llama", tmp_path, seed=0), tiny_dir("tiny-llama", tmp_path, seed=1)
    assert teacher_fingerprint(str(a))["teacher_sha256"] != teacher_fingerprint(str(b))["teacher_sha256"]
    assert teacher_fingerprint(str(a)) == teacher_fingerprint(str(a))

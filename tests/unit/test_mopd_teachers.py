"""The teacher pool: config checks, routing with a default, lazy shared loading, no-grad eval-mode
teachers, tokenizer checks (local and url), filtered rollouts left unscored, and the url client's
request/answer on a fake vLLM server."""

from __future__ import annotations

import json

import httpx
import pytest
import torch

from posttrain.configs import ConfigError, load_config
from posttrain.configs.distill import DistillConfig, TeachersConfig, TeacherSpec
from posttrain.scorers.teachers import RemoteTeacher, ScoringTeacherPool, TokenizerMismatch
from posttrain.models.tiny import build_tiny, tiny_dir, tiny_tokenizer
from posttrain.models.logprobs import sampled_logprobs
from posttrain.configs.rl import AlgoConfig
from posttrain.episodes.collect import Rollout
from posttrain.train.rl import filtered_batch

pytestmark = pytest.mark.usefixtures("one_thread")

SEEDS = {"teacher-a": 1, "teacher-b": 2}


class CountingLoader:
    """``loader`` for the pool: a tiny-llama per spec (seeded by name), counting the loads."""

    def __init__(self):
        self.calls: list[str] = []
        self.models = {}

    def __call__(self, spec):
        self.calls.append(spec)
        self.models[spec] = build_tiny("tiny-llama", len(tiny_tokenizer()), SEEDS.get(spec, 0))
        return self.models[spec], tiny_tokenizer()


def _rollouts():
    g = torch.Generator().manual_seed(0)
    ids = lambda n: torch.randint(3, 500, (n,), generator=g).tolist()  # noqa: E731
    out = []
    for i, env in enumerate(["math", "chat", "code", "math"]):
        prompt, completion = ids(4 + i), ids(3 + i)
        out.append(Rollout(env, f"t{i}", i, prompt + completion, [0] * len(prompt) + [1] * len(completion),
                           [-6.0] * len(completion), "length" if i == 3 else "stop", 0.0))
    return out


def _pool(loader, default="b", **cfg):
    teachers = TeachersConfig(models=[{"name": "a", "model": "teacher-a", "domains": ["math"]},
                                      {"name": "b", "model": "teacher-b", "domains": ["chat"]}], default=default, **cfg)
    return ScoringTeacherPool(teachers, tiny_tokenizer(), loader=loader)


def test_routing_sends_each_domain_to_its_teacher_and_falls_back_to_the_default():
    loader = CountingLoader()
    pool = _pool(loader)
    assert [pool.route(e) for e in ("math", "chat", "code")] == ["a", "b", "b"]
    rollouts = _rollouts()
    batch, _ = filtered_batch(rollouts, AlgoConfig(dynamic_filter=False))  # rollout 3 is overlong: filtered
    metrics = pool(rollouts, batch)
    want_model = {"math": "teacher-a", "chat": "teacher-b", "code": "teacher-b"}
    for b, r in enumerate(rollouts[:3]):
        with torch.no_grad():
            want = sampled_logprobs(loader.models[want_model[r.env]], [r.token_ids], [r.loss_mask])[0]
        torch.testing.assert_close(batch.teacher_logprobs_BT[b, : r.response_tokens], want)
    assert batch.teacher_logprobs_BT[3].abs().sum() == 0  # masked out by the overlong filter: not scored
    assert metrics["teacher_tokens"] == 3 + 4 + 5
    assert {"mopd_gap/math", "mopd_gap/chat", "mopd_gap/code"} <= set(metrics)
    gap = float((batch.sampler_logprobs_BT[0, :3] - batch.teacher_logprobs_BT[0, :3]).mean())
    assert metrics["mopd_gap/math"] == pytest.approx(gap, abs=1e-5)
    with pytest.raises(ConfigError, match="default is not set"):
        _pool(loader, default=None).route("code")


def test_teachers_load_lazily_once_per_model_and_run_without_grad(tmp_path):
    loader = CountingLoader()
    pool = _pool(loader)
    assert loader.calls == [] and pool.loaded == {}  # building the pool loads nothing
    rollouts = _rollouts()
    batch, _ = filtered_batch(rollouts[:1], AlgoConfig(dynamic_filter=False))  # math only: teacher a
    pool(rollouts[:1], batch)
    assert loader.calls == ["teacher-a"]
    model = loader.models["teacher-a"]
    assert not model.training and not any(p.requires_grad for p in model.parameters())
    # two names for one checkpoint (also spelled differently) share one loaded model
    d = tiny_dir("tiny-llama", tmp_path, seed=3)
    cfg = TeachersConfig(models=[{"name": "x", "model": str(d), "domains": ["math"]},
                                 {"name": "y", "model": f"{d}/../{d.name}", "domains": ["chat"]}])
    loader = CountingLoader()
    pool = ScoringTeacherPool(cfg, tiny_tokenizer(), loader=loader)
    batch, _ = filtered_batch(rollouts[:2], AlgoConfig(dynamic_filter=False))
    pool(rollouts[:2], batch)
    assert len(loader.calls) == 1 and pool.teacher("x") is pool.teacher("y") and len(pool.loaded) == 1


def test_tokenizer_mismatch_fails_clearly(tmp_path):
    good = tiny_dir("tiny-llama", tmp_path / "good")
    bad = tiny_dir("tiny-llama", tmp_path / "bad")
    tok = tiny_tokenizer()
    tok.add_tokens(["<mopd_extra>"])
    tok.save_pretrained(bad)
    cfg = TeachersConfig(models=[{"name": "ok", "model": str(good), "domains": ["math"]},
                                 {"name": "other", "model": str(bad), "domains": ["chat"]}])
    loader = CountingLoader()
    with pytest.raises(TokenizerMismatch, match="'other' uses a different tokenizer.*<mopd_extra>"):
        ScoringTeacherPool(cfg, tiny_tokenizer(), loader=loader).check_tokenizers()
    assert loader.calls == []  # checked from the tokenizers alone, before any weights load
    ScoringTeacherPool(TeachersConfig(models=cfg.models[:1]), tiny_tokenizer()).check_tokenizers()


def test_config_errors_name_the_problem():
    with pytest.raises(ValueError, match="exactly one of model"):
        TeacherSpec(name="t", model="a", url="http://x/v1")
    with pytest.raises(ValueError, match="owned by two teachers"):
        TeachersConfig(models=[{"name": "a", "model": "m", "domains": ["math"]},
                               {"name": "b", "model": "m", "domains": ["math"]}])
    with pytest.raises(ValueError, match="default teacher 'c'"):
        TeachersConfig(models=[{"name": "a", "model": "m"}], default="c")
    base = ["envs=[{name: math}, {name: mcq}]", "teachers.models=[{name: a, model: m, domains: [math]}]"]
    with pytest.raises(ConfigError, match="no teacher owns environment 'mcq'"):
        load_config(DistillConfig, None, base)
    with pytest.raises(ConfigError, match=r"domains \['mathh'\] that are not environments"):
        load_config(DistillConfig, None,
                    ["envs=[{name: math}]", "teachers.models=[{name: a, model: m, domains: [mathh]}]"])
    cfg = load_config(DistillConfig, None, [*base, "teachers.default=a", "algo.loss=pg"])
    assert cfg.algo.advantage.type == "mopd" and cfg.algo.dynamic_filter is False  # distillation's defaults survive
    with pytest.raises(ConfigError, match="temperature"):  # url teachers score at temperature 1 only
        load_config(DistillConfig, None, ["envs=[{name: math}]", "rollout.temperature=0.7",
                                          "teachers.models=[{name: u, url: 'http://x/v1'}]", "teachers.default=u"])


def test_url_teacher_request_answer_and_tokenizer_probe():
    tok = tiny_tokenizer()
    sent = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        sent.append((request.url.path, body))
        if request.url.path == "/tokenize":
            return httpx.Response(200, json={"tokens": tok(body["prompt"], add_special_tokens=False)["input_ids"]})
        ids = body["prompt"]
        logprobs = {"token_logprobs": [None] + [-0.1 * t for t in range(1, len(ids))] + [-9.0],
                    "tokens": [f"token_id:{i}" for i in ids] + ["token_id:7"]}
        return httpx.Response(200, json={"choices": [{"index": 0, "logprobs": logprobs}]})

    client = httpx.Client(transport=httpx.MockTransport(handler))
    cfg = TeachersConfig(models=[{"name": "srv", "url": "http://teacher:8000/v1#big", "domains": ["math"]}])
    pool = ScoringTeacherPool(cfg, tok, remote_kwargs={"client": client})
    pool.check_tokenizers()
    rollouts = _rollouts()[:1]
    batch, _ = filtered_batch(rollouts, AlgoConfig(dynamic_filter=False))
    pool(rollouts, batch)
    path, body = sent[-1]
    assert path == "/v1/completions" and body["prompt"] == rollouts[0].token_ids and body["model"] == "big"
    assert body["echo"] is True and body["max_tokens"] == 1 and body["logprobs"] == 0
    prompt_len = rollouts[0].loss_mask.index(1)
    want = [-0.1 * t for t in range(prompt_len, len(rollouts[0].token_ids))]
    torch.testing.assert_close(batch.teacher_logprobs_BT[0], torch.tensor(want))

    def other_tokenizer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"tokens": [1, 2, 3]})

    pool = ScoringTeacherPool(cfg, tok,
                              remote_kwargs={"client": httpx.Client(transport=httpx.MockTransport(other_tokenizer))})
    with pytest.raises(TokenizerMismatch, match="tokenizes a probe text differently"):
        pool.check_tokenizers()
    r = RemoteTeacher("http://t/v1#m", client=httpx.Client(transport=httpx.MockTransport(
        lambda req: httpx.Response(200, json={"choices": [{"logprobs": {"token_logprobs": [None, -1.0, -1.0],
                                                                         "tokens": ["token_id:9"] * 3}}]}))))
    with pytest.raises(TokenizerMismatch, match="echoed different token ids"):
        r.score([[1, 2, 3]], [[0, 1, 1]])


def test_recipe_validates():
    from pathlib import Path

    cfg = load_config(DistillConfig, Path(__file__).parents[2] / "recipes" / "distill.yaml")
    assert cfg.teachers.teacher_for("math") == "math" and cfg.teachers.teacher_for("mcq") == "generalist"


# --------------------------------------------------------------------------- issue 12, item 18 (teachers)


def _retokenized(edit):
    """The tiny tokenizer with its tokenizer.json edited by ``edit(dict)``: same vocabulary, other splitting."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    tok = tiny_tokenizer()
    spec = json.loads(tok.backend_tokenizer.to_str())
    edit(spec)
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(spec)), bos_token=tok.bos_token,
                                   eos_token=tok.eos_token, pad_token=tok.pad_token, unk_token=tok.unk_token)


def _reverse_merges(spec):
    spec["model"]["merges"] = spec["model"]["merges"][::-1]


def _no_regex(spec):
    spec["pre_tokenizer"]["use_regex"] = False


def test_same_vocab_with_other_merges_or_pre_tokenizer_is_a_mismatch(tmp_path, monkeypatch):
    # this passed the old check (vocab and eos only): a teacher would score token sequences it would
    # never have produced for the same text
    student = tiny_tokenizer()
    merged = _retokenized(_reverse_merges)
    assert merged.get_vocab() == student.get_vocab() and merged.eos_token == student.eos_token
    d = tiny_dir("tiny-llama", tmp_path)
    merged.save_pretrained(d)  # through a directory, as a real teacher comes
    cfg = TeachersConfig(models=[{"name": "remerged", "model": str(d), "domains": ["math"]}])
    loader = CountingLoader()
    with pytest.raises(TokenizerMismatch, match=r"'remerged' has the student's vocabulary but splits text "
                                                r"differently: its merges differ \(253 vs the student's 253; merge 0"):
        ScoringTeacherPool(cfg, student, loader=loader).check_tokenizers()
    assert loader.calls == []
    from posttrain.scorers.teachers import compare_tokenizers

    with pytest.raises(TokenizerMismatch, match="its pre-tokenizer differs"):
        compare_tokenizers(student, _retokenized(_no_regex), "t")
    # where tokenizer.json cannot be compared (a slow tokenizer), the probe texts still catch it
    monkeypatch.setattr("posttrain.scorers.teachers._splitting", lambda tok: None)
    with pytest.raises(TokenizerMismatch, match="the probe text .* gives other ids from token"):
        compare_tokenizers(student, merged, "t")
    compare_tokenizers(student, tiny_tokenizer(), "t")  # the same tokenizer still passes both checks


def test_teacher_embedding_smaller_than_the_students_tokenizer_fails_at_load(tmp_path):
    # this passed the old check, then scoring hit an id past the teacher's embedding (IndexError)
    student = tiny_tokenizer()
    small = tmp_path / "small"
    build_tiny("tiny-llama", 400).save_pretrained(small)
    student.save_pretrained(small)
    cfg = TeachersConfig(models=[{"name": "small", "model": str(small), "domains": ["math"]}])
    loader = CountingLoader()
    with pytest.raises(TokenizerMismatch, match=rf"teacher 'small' \(.*small\) has an embedding of 400 tokens but "
                                                rf"the student's tokenizer has {len(student)} ids"):
        ScoringTeacherPool(cfg, student, loader=loader).check_tokenizers()
    assert loader.calls == []  # from config.json: before any weights load

    # a loader (or a spec without config.json) is checked when the weights load, before scoring
    def small_loader(spec):
        return build_tiny("tiny-llama", 400), tiny_tokenizer()

    pool = ScoringTeacherPool(TeachersConfig(models=[{"name": "tiny", "model": "tiny-llama", "domains": ["math"]}]),
                       student, loader=small_loader)
    rollouts = _rollouts()[:1]
    batch, _ = filtered_batch(rollouts, AlgoConfig(dynamic_filter=False))
    with pytest.raises(TokenizerMismatch, match="teacher 'tiny' has an embedding of 400 tokens"):
        pool(rollouts, batch)
    # and an id past a loaded teacher's embedding is one line, not an IndexError from the forward
    from posttrain.scorers.teachers import LocalTeacher

    teacher = LocalTeacher(build_tiny("tiny-llama", 400), 4096, 0, "t")
    with pytest.raises(TokenizerMismatch, match="teacher 't' has an embedding of 400 tokens but a rollout holds "
                                                "token id 450"):
        teacher.score([[5, 450, 7]], [[0, 1, 1]])

"""Scale-out pieces without Ray: the scale config's rules, the pure helpers of the Ray rollout
source (staleness, how prompts are split, the in-process order), and the checkpoint-file weight
sync round trip (tied weights, pruning, strict names)."""

from __future__ import annotations

import pytest
import torch

from posttrain.configs import ConfigError, load_config
from posttrain.configs.rl import RLConfig
from posttrain.configs.scale import CheckpointSyncConfig
from posttrain.episodes.collect import Rollout
from posttrain.models.tiny import build_tiny
from posttrain.scale.rollouts import in_process_order, split_picks, staleness
from posttrain.scale.weight_sync import CheckpointSync, apply_weights


def test_staleness_counts_the_oldest_rollout():
    assert staleness([5, 5, 5], 5) == 0
    assert staleness([3, 5, 4], 5) == 2
    assert staleness([], 7) == 0


def test_split_picks_covers_every_prompt_once():
    assert split_picks(8, 1) == [(0, 8)]
    assert split_picks(8, 3) == [(0, 3), (3, 6), (6, 8)]
    assert split_picks(2, 4) == [(0, 1), (1, 2)]  # more workers than prompts: idle workers get nothing


def test_in_process_order_is_env_then_group_stable():
    def r(env, group, j):
        return Rollout(env, f"{env}/{group}/{j}", group, [1], [1], [0.0], "stop")

    merged = [r("mcq", 1, 0), r("math", 2, 0), r("math", 2, 1), r("mcq", 1, 1), r("math", 0, 0), r("math", 0, 1)]
    out = in_process_order(merged, ["math", "mcq"])
    assert [x.task_id for x in out] == ["math/0/0", "math/0/1", "math/2/0", "math/2/1", "mcq/1/0", "mcq/1/1"]


@pytest.mark.parametrize("over, words", [
    (["scale.ahead=1"], "needs backend: ray"),
    (["scale.trainer.count=2"], "needs backend: ray"),
    (["scale.backend=ray", "scale.trainer.count=2", "scale.trainer.backend=nccl"], "nccl needs one GPU per trainer"),
    (["scale.backend=ray", "scale.trainer.count=2", "scale.trainer.num_gpus=0.5"], "nccl needs one GPU per trainer"),
    (["scale.backend=ray", "scale.trainer.backend=gloo", "scale.trainer.num_gpus=1"], "gloo shards CPU tensors"),
    (["scale.backend=ray", "scale.trainer.backend=mpi"], "trainer.backend"),
    (["scale.backend=ray", "scale.trainer.count=0"], "trainer.count"),
    (["scale.backend=ray", "scale.ahead=3", "scale.max_staleness=3", "scale.weight_sync={type: checkpoint, keep: 2}"],
     "must exceed ahead"),
    (["scale.weight_sync={type: nccl, master_prot: 1}"], "master_prot"),
    (["scale.rollout.num_cpus=-1"], "num_cpus"),
])
def test_scale_config_errors_name_the_field(over, words):
    with pytest.raises(ConfigError, match=words):
        load_config(RLConfig, None, over)


def test_sharded_trainer_backend_follows_the_gpus():
    cpu = load_config(RLConfig, None, ["scale.backend=ray", "scale.trainer.count=2"]).scale.trainer
    gpu = load_config(RLConfig, None, ["scale.backend=ray", "scale.trainer.count=4", "scale.trainer.num_gpus=1"])
    assert cpu.resolved_backend() == "gloo" and gpu.scale.trainer.resolved_backend() == "nccl"


@pytest.mark.skipif(torch.cuda.is_available(),
                    reason="on a CUDA machine the nccl group initialises and there is no error to check: "
                           "the one-line refusal exists only without a GPU")
def test_nccl_trainer_without_a_gpu_is_one_line():
    from posttrain.errors import UserError
    from posttrain.train import sharding

    with pytest.raises(UserError, match="nccl needs a CUDA GPU") as e:
        sharding.init(0, 2, "nccl", "127.0.0.1", 1, timeout_s=1)
    assert "\n" not in str(e.value) and sharding.current() is None


def test_sharded_trainer_refuses_moe_models(tmp_path, monkeypatch):
    from posttrain.errors import UserError
    from posttrain.train import loop, sharding

    monkeypatch.setattr(sharding, "_CURRENT", sharding.Ranks(0, 2, "cpu"))  # as if rank 0 of two
    cfg = load_config(RLConfig, None, ["model=tiny-nemotronh", f"run_dir={tmp_path}"])
    with pytest.raises(UserError, match="shards dense models without LoRA; this run has MoE routers"):
        loop.setup(cfg, freeze_routers=True, numerics="rl")


def test_optimizer_state_of_another_trainer_count_is_refused(tmp_path):
    from posttrain.train.loop import CheckpointError, _load_optimizer
    from posttrain.train.sharding import Ranks

    model = build_tiny("tiny-llama", seed=0)
    opt = torch.optim.AdamW(model.parameters())
    one = {"state": {0: {}}, "param_groups": []}  # a one-process optimizer: keyed by index
    with pytest.raises(CheckpointError, match="written by a single trainer.*same trainer.count"):
        _load_optimizer(opt, one, model, Ranks(0, 2, "cpu"), tmp_path)
    sharded = {"state": {"model.embed_tokens.weight": {}}, "param_groups": []}
    with pytest.raises(CheckpointError, match="written by a sharded trainer"):
        _load_optimizer(opt, sharded, model, None, tmp_path)


def test_same_recipe_switches_backend_by_one_key():
    cfg = load_config(RLConfig, "recipes/rl.yaml", ["scale.backend=ray", "scale.ahead=1"])
    assert cfg.scale.backend == "ray" and cfg.scale.weight_sync.type == "object_store"
    assert load_config(RLConfig, "recipes/rl.yaml", []).scale.backend == "inprocess"


class _Engine:  # what apply_weights needs of the HF engine: its module
    def __init__(self, model):
        self.model = model


def test_checkpoint_sync_round_trip(tmp_path):
    src, dst = build_tiny("tiny-llama", seed=1), build_tiny("tiny-llama", seed=2)
    with torch.no_grad():  # a trained model: the tied embedding moved too
        for p in src.parameters():
            p.add_(0.01)
    sync = CheckpointSync(CheckpointSyncConfig(dir=str(tmp_path / "w"), keep=2), str(tmp_path))
    paths = [sync.publish(src, v) for v in range(3)]
    assert sorted(p.name for p in (tmp_path / "w").glob("v*.safetensors")) == ["v000001.safetensors",
                                                                                 "v000002.safetensors"]
    assert not list((tmp_path / "w").glob("*.tmp"))
    sync.load(paths[-1], _Engine(dst))
    for (name, a), (_, b) in zip(src.state_dict().items(), dst.state_dict().items()):
        assert torch.equal(a, b), name
    assert dst.lm_head.weight.data_ptr() == dst.model.embed_tokens.weight.data_ptr()  # still tied


def test_apply_weights_is_strict():
    model = build_tiny("tiny-llama", seed=0)
    named = {k: v.clone() for k, v in model.state_dict().items()}
    named.pop(next(iter(named)))
    with pytest.raises(RuntimeError, match="Missing key"):
        apply_weights(_Engine(model), named)


def test_apply_weights_reaches_the_fp32_module_and_its_bf16_sampling_copy():
    """A rollout worker's HF engine with bf16 sampling weights: the pushed weights go to the fp32
    module (greedy validation decodes with it) and the bf16 copy follows."""
    from posttrain.engines.hf import HFGenerator
    from posttrain.models.loading import load_model

    tok = load_model("tiny-llama", device="cpu").tokenizer
    src, dst = build_tiny("tiny-llama", seed=1), build_tiny("tiny-llama", seed=2)
    gen = HFGenerator(dst, tok, dtype="bf16")
    apply_weights(gen, {k: v.clone() for k, v in src.state_dict().items()})
    for a, b, c in zip(src.parameters(), gen.live.parameters(), gen.model.parameters()):
        assert torch.equal(a, b) and torch.equal(a.to(torch.bfloat16), c)


@pytest.mark.parametrize("recipe", ["recipes/gpu/rl_8gpu.yaml", "recipes/gpu/rl_multinode.yaml"])
def test_gpu_recipes_validate_and_say_untested(recipe):
    from pathlib import Path

    text = Path(recipe).read_text()
    assert text.startswith("# UNTESTED here (no GPU)")
    cfg = load_config(RLConfig, recipe, [])
    assert cfg.scale.backend == "ray" and cfg.rollout.engine.type == "vllm" and cfg.scale.weight_sync.type == "nccl"
    assert cfg.scale.rollout.num_gpus == 1 and cfg.scale.trainer.num_gpus == 1
    assert cfg.scale.trainer.count > 1 and cfg.scale.trainer.resolved_backend() == "nccl"  # FSDP2 over GPUs
    assert "What did run, on CPUs: the sharded trainer" in text


def test_stages_without_ray_support_refuse_backend_ray(tmp_path):
    from posttrain.errors import UserError
    from posttrain.train.rl import train_rl

    cfg = load_config(RLConfig, None, ["model=tiny-llama", f"run_dir={tmp_path}", "scale.backend=ray"])
    with pytest.raises(UserError, match="runs through `posttrain rl`"):
        train_rl(cfg, progress=False)  # what distill / rlhf / genrm call: never silently in process

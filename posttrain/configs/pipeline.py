"""The main job's config (``posttrain pipeline``; the experiment is ``experiments/pipeline.py``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from posttrain.configs.base import StrictModel


class PipelineConfig(StrictModel):
    model: str = "embedded"
    run_dir: str = "runs/pipeline"
    seed: int = 0
    n_train: int = Field(2000, ge=8)
    """Generated SFT conversations."""
    n_eval: int = Field(200, ge=4)
    """Held-out problems for answer accuracy (greedy); the standard error of an accuracy near 50%
    is about 3.5 points at 200, and paired gains are usually tighter."""
    n_val_rows: int = Field(64, ge=4)
    """Held-out conversations for the SFT loss."""
    sft_instruction_rows: int = Field(0, ge=0)
    """Instruction-following conversations added to the SFT data: tasks of the ``instruction``
    environment's train split (1-2 verifiable formatting constraints, as the RLVR stage's) answered by
    its scripted writer, whose replies pass every check (envs/instruction/writer.py). An SFT stage that
    teaches a second domain gives the RLVR stage something to sharpen there: an arithmetic-only SFT
    model scored 0.000 on instruction dev tasks, so its groups carried no GRPO signal
    (docs/results/rlvr_vs_sft.md). 0: arithmetic only."""
    eval_samples: int = Field(8, ge=0)
    """Sampled answers per held-out problem for the *sampled accuracy* of the SFT, RL (and longer-SFT)
    checkpoints: pass@1 estimated from this many samples at the RLVR stage's temperature
    (docs/recipe.md §7), the quantity GRPO raises; each problem's score is the fraction of its samples
    that are right, so paired gains are tighter than greedy ones. 0: greedy only."""
    max_digits: int = Field(2, ge=1, le=3)
    sft_steps: int = Field(40, ge=1)
    sft_batch_size: int = Field(16, ge=1)
    sft_lr: float = Field(1e-4, gt=0)
    sft_freeze_layers: int = Field(0, ge=0)
    """SFT trains only the blocks above this one (``train.freeze_layers``): the embeddings and the
    first N of the 30 blocks stay as loaded, and backward stops at block N. 0: every weight."""
    max_new_tokens: int = Field(80, ge=8)
    eval_batch_size: int = Field(32, ge=1)
    eval_precision: Literal["fp32", "auto"] = "fp32"
    """Precision of the RL-vs-control test table's greedy decoding (every checkpoint in it alike).
    ``fp32``: the live module, so a figure does not depend on the machine. ``auto``: bf16 where the
    machine probe measures bf16 matmul >= 1.3x fp32 (models/precision.py), else fp32. ``--quick`` uses
    ``auto``: 1.6x faster decoding; on 96 problems an SFT checkpoint's replies differ in 25 places and
    its rewards in none (bench/results/eval_precision.jsonl#L1). The headline measurement (base and
    SFT on the held-out problems) stays fp32: the base model's accuracy read 5.2 points lower in bf16."""
    curation: bool = False
    """Add the curation stage: rejection sampling from the model itself with the math verifier, then
    SFT on the curated rows vs on as many unfiltered samples (experiments/curation.py; ~12 min)."""
    rlvr: bool = True
    """Run the RLVR stage: GRPO from the SFT checkpoint on ``rl_mix`` (by default the ``arithmetic``
    environment, the train split of the problems the held-out accuracy measures in ``rl_phrasings``,
    and ``instruction``), reasoning-on prompts as measured, with the SFT anchor (``rl_sft_anchor``)."""
    rl_steps: int = Field(24, ge=1)
    """GRPO steps of the RLVR stage (``rl_prompts_per_step`` x ``rl_group_size`` rollouts each)."""
    rl_lr: float = Field(2e-5, gt=0)
    """Constant learning rate of the RLVR stage: no warmup, no decay, no weight decay (5e-5 cost 26.5
    points of held-out accuracy in 16 steps, docs/results/pipeline.md)."""
    rl_prompts_per_step: int = Field(8, ge=1)
    """Prompts per RLVR step."""
    rl_group_size: int = Field(8, ge=2)
    """Rollouts per prompt (the GRPO group whose rewards are centred)."""
    rl_temperature: float = Field(0.7, gt=0)
    """Sampling temperature of the RLVR stage's rollouts."""
    rl_curriculum: Literal["random", "gaussian"] = "random"
    """How the RLVR stage picks its tasks. ``random``: uniformly from the training pools. ``gaussian``:
    the recipe's pass-rate curriculum (docs/recipe.md §2): the stage first profiles the SFT checkpoint
    (``rl_profile_k`` samples at the rollout temperature on each of the first ``rl_profile_tasks``
    tasks of every pool), then each step draws tasks around a target pass rate that moves from easy
    to hard, always-solved tasks dropped, so fewer GRPO groups have equal rewards. The profile runs
    inside the stage: its time is the RL stage's time, which the same-time control gets too."""
    rl_profile_tasks: int = Field(64, ge=1)
    """Tasks per RLVR environment the curriculum profiles (the first of each pool; at most the pool)."""
    rl_profile_k: int = Field(4, ge=2)
    """Samples per profiled task (a pass rate needs at least two)."""
    rl_arith_train_tasks: int = Field(1000, ge=1)
    """The RLVR stage's arithmetic training pool (arithmetic train split, sampled uniformly)."""
    rl_phrasings: list[Literal["plain", "words", "story"]] = Field(
        default_factory=lambda: ["words", "story"], min_length=1)
    """Wordings of the RLVR stage's arithmetic problems, for training and validation alike
    (envs/arithmetic.py): ``plain`` is the SFT data's ("What is a + b?"), ``words`` and ``story`` ask
    the same problems in other words, which the SFT model does not carry its traces over to (greedy:
    plain 48%, words 29%, story 7%). RLVR teaches that carry-over (story +0.12 to +0.23 in twelve
    runs); without the SFT anchor it un-taught as much on ``plain`` (docs/results/pipeline.md). The
    default leaves ``plain`` out: where the SFT rows reach, more SFT beat the reward in every trial
    (trials 8-11 of docs/results/rlvr_vs_sft.md), so the stage spends its rollouts where they do not."""
    rl_min_digits: int = Field(1, ge=1, le=3)
    """The RLVR stage's arithmetic problems (training and validation) have a longer operand of at
    least this many digits (at most ``max_digits``); 2 leaves out the 1-digit problems, whose short
    traces RL otherwise carries over to 2-digit ones — which did not stop the plain loss above."""
    rl_sft_anchor: float = Field(3.0, ge=0)
    """Weight of the SFT anchor in the RLVR stage (InstructGPT's PPO-ptx, ``algo.sft_anchor``): each
    GRPO step also trains on ``rl_anchor_rows`` conversations of the SFT data, this times their
    token-mean cross-entropy. On the 200 held-out RL tasks (seed 0): weight 0 +0.025 +- 0.031 pooled
    with plain -0.158; 1: +0.045 +- 0.029, plain -0.070; 3: +0.080 +- 0.033, plain +0.000; 10: +0.065
    +- 0.032 (docs/results/pipeline.md). 0: off."""
    rl_anchor_rows: int = Field(8, ge=1)
    """SFT conversations per RLVR step for the anchor."""
    rl_mix: dict[Literal["arithmetic", "math", "mcq", "instruction"], float] = Field(
        default_factory=lambda: {"arithmetic": 1.0, "instruction": 1.0})
    """Domains of the RLVR stage and their sampling ratios. ``arithmetic`` is the pipeline's own
    problems (the distribution its held-out accuracy measures); ``math``, ``mcq``, ``instruction``
    are the three-domain runs' environments (``RL_DOMAINS`` in experiments/pipeline.py), each with
    ``rl_mix_train_tasks`` training tasks. Every listed domain is validated (``rl_val_tasks`` each);
    a ratio of 0 validates without training. The default adds ``instruction`` (1-2 verifiable
    constraints), which the SFT rows never demonstrate: trial 11 of docs/results/rlvr_vs_sft.md, the
    design that met issue 33's bar (RL − SFT same time beyond 2 se on both domains, three seeds, test),
    whose instruction gain is mostly winning back what the arithmetic SFT cost."""
    rl_math_families: list[Literal["addition", "chain_sum", "multiplication", "mixed_arithmetic", "linear_equation", "gcd",
                                   "lcm", "fraction_simplification", "leg_counting", "word_problem"]] | None = None
    """The reasoning-gym families of the RLVR stage's ``math`` domain (``FAMILIES`` in envs/math_env.py;
    a test keeps the two lists equal). None: ``RL_DOMAINS``'s five arithmetic families."""
    rl_mix_train_tasks: int = Field(1000, ge=1)
    """Training pool per non-arithmetic domain of the RLVR stage."""
    rl_mix_lr: float = Field(1e-5, gt=0)
    """Constant learning rate of the three-domain runs (distill specialists, MOPD, GenRM, RLHF)."""
    rl_val_tasks: int = Field(0, ge=0)
    """Held-out tasks per domain, graded greedily at the start and at the end of every RL run (200:
    a gain of 0.08 is ~2.5 paired standard errors; at 64 it was ~1.4). 0: the RLVR stage does not
    validate itself, the default (the test table compares the stage; a validation's time counts in the
    stage's and so in the same-time control's budget: ~6 CPU min at 200 tasks a domain, spent twice;
    ``--quick``: 8 tasks at 2 steps measured nothing)."""
    rl_mix_val_tasks: int = Field(64, ge=1)
    """Held-out tasks per domain of the three-domain runs (distill specialists, MOPD, GenRM, RLHF)."""
    rl_train_tasks: int = Field(48, ge=1)
    """Training pool per domain of the three-domain runs (sampled uniformly, no curriculum profile)."""
    sft_arm: bool = True
    """The same-time control (experiments/evidence.py): continue SFT from the SFT checkpoint for as many
    steps as fit in the RLVR stage's time (at the SFT stage's measured pace); scored on the test table
    beside the RL checkpoint. ``--no-controls`` turns both controls off."""
    tokens_arm: bool = True
    """The same-tokens control: continue SFT from the SFT checkpoint for as many target tokens as the
    RLVR stage trained on (rollout tokens + anchor rows), scored on the test table beside RL."""
    rft_arm: bool = True
    """The rejection-sampling control (``algo.advantage: rft``): the RLVR stage run again from the SFT
    checkpoint with the same environments, rollouts per step, steps, anchor and lr, training on the
    samples the verifier passes instead of the group-relative advantage; scored on the test table
    beside RL (*RL − RFT same rollouts*: what the reward's contrast adds over keeping what passes).
    On by default (about one more RL stage of time): in trials 9-11 of docs/results/rlvr_vs_sft.md RFT
    did as well as RL or better, which no report should leave out. ``--quick`` and ``--no-controls``
    turn it off."""
    control_lr: float | None = Field(None, gt=0)
    """Peak learning rate of both controls (warmup-stable-decay, as the SFT stage); None: ``sft_lr``.
    A control is only as fair as its tuning: choose it on dev (``table_split=dev``) like the RL stage's
    settings, taking the one under which the control scores best."""
    tokens_control_lr: float | None = Field(None, gt=0)
    """The same-tokens control's peak learning rate when it differs from ``control_lr`` (None: the same).
    Each control gets the lr under which it scored best on dev: at recipes/pipeline_evidence.yaml's size
    (seed 0, 96 dev tasks) same time 0.323 at 2e-4 vs 0.281 at 2e-5, same tokens 0.240 at 2e-4 vs
    0.302 at 2e-5 (docs/results/rlvr_vs_sft.md)."""
    rl_test_tasks: int = Field(200, ge=1)
    """Test tasks per RLVR environment on which base, SFT, RL and the controls are scored (greedy, the
    RL rollout's prompt and budget): the RL − control figures of the report."""
    table_split: Literal["dev", "test"] = "test"
    """The split the RL-vs-control table scores: ``test`` for the reported figures, ``dev`` for runs that
    choose a setting (a domain mix, a step count): choose on dev, then report test."""
    rl_headline: bool = True
    """Also measure the RL checkpoint, and the same-time control (``sft_arm``), on the headline problems
    (the SFT stage's before/after measure), for the report's RL and "longer SFT" columns and their
    gains there: the SFT data's own wording, which the test table lacks when RL trains elsewhere.
    ``--quick`` skips it (~30 s each): the test table scores the RL checkpoint against SFT and the
    controls anyway."""
    test_base: bool = True
    """Also score the base model on the test table (``--quick`` skips it: ~25 s)."""
    anchor_control: bool = False
    """Add the anchor-alone control: SFT from the SFT checkpoint on what the RLVR stage's anchor trains
    on (``rl_steps`` steps of ``rl_anchor_rows`` conversations of the same data, at ``rl_lr``, constant,
    in fp32 as the RL stage computes), measured on the same held-out problems and on the RLVR stage's
    validation tasks: *RL − anchor alone* is what the reward adds (docs/results/pipeline.md)."""
    rl_overrides: list[str] = Field(default_factory=list)
    """RLConfig overrides (``key.sub=value``) applied last to every RL run, e.g.
    ``[rollout.group_size=4, rollout.max_new_tokens=64]``; tests shrink the runs with it."""
    distill: bool = False
    """Add the distill stage: a math and an instruction RLVR specialist from the SFT checkpoint, then
    MOPD of both into the SFT checkpoint (posttrain/distill); about three RL runs' time."""
    specialist_steps: int = Field(10, ge=1)
    """GRPO steps of each specialist (one domain trained, the others validated only)."""
    distill_steps: int = Field(10, ge=1)
    """MOPD steps of the student."""
    rlhf: bool = False
    """Add the RLHF stage (opt-in): a GenRM trained with GRPO on rule-built math preference pairs
    from the SFT checkpoint (``genrm_steps``), then RLHF with it as the judge from the RLVR checkpoint
    (the SFT one without RLVR), with group length control; docs/rlhf.md."""
    genrm_steps: int = Field(10, ge=0)
    """GRPO steps of the GenRM (0: no GenRM training; the judge is ``rlhf_judge`` or the SFT checkpoint)."""
    genrm_pairs: int = Field(64, ge=2)
    """Rule-built math preference pairs for the GenRM (each in both orders)."""
    rlhf_judge: str | None = None
    """A judge to use instead of training one (model spec / HF directory, or an http:// endpoint)."""
    rlhf_steps: int = Field(10, ge=1)
    """GRPO steps of the RLHF run (same domains and batch as RLVR; the verifiers only validate)."""
    rlhf_overrides: list[str] = Field(default_factory=list)
    """Overrides applied last to the GenRM and RLHF runs (``judge.*`` and ``length_control.*`` to
    the RLHF run only), e.g. ``[judge.max_new_tokens=64, length_control.enabled=false]``."""


    @model_validator(mode="after")
    def _arm_needs_rl(self) -> "PipelineConfig":
        if self.rft_arm and not self.rlvr and "rft_arm" not in self.model_fields_set:
            object.__setattr__(self, "rft_arm", False)  # on by default: only for a run that has an RLVR stage
        if self.rft_arm and not self.rlvr:
            raise ValueError("rft_arm: the control repeats the RLVR stage with another advantage; it needs rlvr=true "
                             "(with rlvr=false pass rft_arm=false too, or use --no-rlvr)")
        if self.anchor_control and not (self.rlvr and self.rl_sft_anchor > 0):
            raise ValueError("anchor_control: the control is the RLVR stage's SFT anchor alone; it needs rlvr=true "
                             f"and rl_sft_anchor > 0 (got rlvr={self.rlvr}, rl_sft_anchor={self.rl_sft_anchor})")
        if self.rlvr and not any(r > 0 for r in self.rl_mix.values()):
            raise ValueError(f"rl_mix: {self.rl_mix}: no domain with a ratio > 0 for the RLVR stage to train on "
                             "(or pass --no-rlvr)")
        if self.rl_min_digits > self.max_digits:
            raise ValueError(f"rl_min_digits={self.rl_min_digits} is above max_digits={self.max_digits}: "
                             "no arithmetic problem to train on")
        if any(r < 0 for r in self.rl_mix.values()):
            raise ValueError(f"rl_mix: {self.rl_mix}: ratios must be >= 0")
        if self.rl_math_families is not None and (not self.rl_math_families or "math" not in self.rl_mix):
            raise ValueError(f"rl_math_families={self.rl_math_families}: name at least one family, and put math in "
                             f"rl_mix (got {self.rl_mix})")
        pools = {"arithmetic": self.rl_arith_train_tasks}
        small = {d: pools.get(d, self.rl_mix_train_tasks) for d in self.rl_mix}
        small = {d: n for d, n in small.items() if n < self.rl_profile_tasks}
        if self.rl_curriculum == "gaussian" and small:
            raise ValueError(f"rl_profile_tasks={self.rl_profile_tasks} is more than the training pool of "
                             f"{', '.join(f'{d} ({n})' for d, n in small.items())}: profile at most the pool")
        return self

QUICK = {"n_train": 400, "n_eval": 96, "n_val_rows": 24, "sft_steps": 16, "sft_batch_size": 16,
         "sft_lr": 3e-4, "sft_freeze_layers": 15, "max_new_tokens": 80, "eval_batch_size": 96, "eval_precision": "auto", "rl_steps": 2, "rl_prompts_per_step": 4, "rl_group_size": 4,
         "rl_arith_train_tasks": 200, "rl_val_tasks": 0, "rl_test_tasks": 48, "test_base": False, "rft_arm": False,
         "rl_headline": False,
         "control_lr": 2e-4, "tokens_control_lr": 2e-5, "rl_mix_val_tasks": 8, "eval_samples": 0, "rl_lr": 1e-5,
         "specialist_steps": 2, "distill_steps": 2,
         "genrm_steps": 2, "rlhf_steps": 2, "run_dir": "runs/pipeline-quick"}
"""``posttrain pipeline --quick``: every default stage for a moment. SFT 16 x 16 at lr 3e-4 (two thirds of
the 384 rows), chosen on dev for the 4-minute target (bench/quick_sft_dev.py, 3 seeds, 96 dev problems: +19.4
+- 2.9 points against +19.1 +- 2.9 for the earlier 24 x 16 at 2e-4, in 83 s instead of 116 s), of the top 15 of the 30 blocks (``sft_freeze_layers``: backward stops halfway, the
stage took 112 s instead of 206 s for +27.1 +- 5.0 points instead of +24.0 +- 5.1, seed 0; the top 10
alone gave +12.5 +- 4.7) and the default's 80 new tokens: 20 x 8 at 3e-4 with 64 tokens taught the answer
format but not the sums, 64 tokens cut the SFT model's carry traces before ``Answer:``, and 40 x 8
left one seed at 2.2 standard errors. RLVR: 2 steps of 4 x 4 on the default mix at lr 1e-5, no validation
of its own (``rl_val_tasks`` 0; the test table measures it); the same-time control at peak lr 2e-4, not the
SFT stage's 3e-4, chosen on dev (bench/quick_control_dev.py, 3 seeds: 0.264 against 0.215 at 3e-4, below its
start's 0.257, and 0.243 at 2e-5), greedy accuracy only (``eval_samples`` 0: the sampled accuracy would add ~2 min): at the default's 2e-5, two Adam steps on 16 rollouts moved every weight by ~2e-5 in a noise
direction and cost 7.3 +- 3.4 points of held-out accuracy (seed 0, 1 thread). The 96 held-out
problems decode in one batch (``eval_batch_size`` 96: fewer, wider decode steps than 3 x 32, the same
answers on three seeds; bench/eval_batch.py). The measured gains of three seeds and the wall time on an idle machine are in docs/results/pipeline.md."""

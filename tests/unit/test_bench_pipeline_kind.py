"""bench/pipeline.py's row names what a recorded run ran: its kind (quick or default sizes) and the
settings in which it differs from that kind's current defaults (a probe is not today's command)."""

from __future__ import annotations

import yaml

from tests.script_module import script_module


def test_a_run_is_quick_or_default_and_lists_what_it_changed(tmp_path):
    from posttrain.configs.pipeline import QUICK, PipelineConfig

    with script_module("bench", "pipeline") as bench:
        default = PipelineConfig().model_dump()
        (tmp_path / "d").mkdir()
        (tmp_path / "d" / "pipeline.yaml").write_text(yaml.safe_dump({**default, "run_dir": "elsewhere", "seed": 2}))
        assert bench.kind(tmp_path / "d") == ("default", {})
        probe = {**default, "sft_steps": 80, "rl_phrasings": ["plain", "story"]}
        (tmp_path / "d" / "pipeline.yaml").write_text(yaml.safe_dump(probe))
        assert bench.kind(tmp_path / "d") == ("default", {"sft_steps": 80, "rl_phrasings": ["plain", "story"]})
        quick = PipelineConfig(**QUICK).model_dump()
        (tmp_path / "d" / "pipeline.yaml").write_text(yaml.safe_dump({**quick, "rl_lr": 3e-5}))
        assert bench.kind(tmp_path / "d") == ("quick", {"rl_lr": 3e-5})
        # which stages ran is not a setting: --anchor-control / --no-controls / --distill ... are today's command
        stages = {**quick, "anchor_control": True, "sft_arm": True, "distill": True, "rlhf": True, "curation": True}
        (tmp_path / "d" / "pipeline.yaml").write_text(yaml.safe_dump(stages))
        assert bench.kind(tmp_path / "d") == ("quick", {})


def test_the_row_names_the_cpu_class_that_decides_its_wall_time(tmp_path):
    avx2 = tmp_path / "avx2"
    avx2.write_text("processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse2 avx avx2 fma\n")
    bf16 = tmp_path / "bf16"
    bf16.write_text("cpu family\t: 26\nmodel\t\t: 2\nmodel name\t: AMD EPYC 9R14\nflags\t\t: avx2 avx512f avx512_bf16 fma\n")
    from posttrain.models import blas

    with script_module("bench", "results_row") as bench:  # every bench's machine(), the pipeline rows' cpu
        # and whether MKL ran its tuned kernels on an AMD CPU (models/blas.py): the other thing that sets fp32 speed
        assert bench.cpu_facts(str(avx2)) == {"model": "AMD EPYC", "vector": ["avx2"], "mkl_amd": blas.STATE}
        assert bench.cpu_facts(str(bf16)) == {"model": "AMD EPYC 9R14", "vector": ["avx2", "avx512f", "avx512_bf16"],
                                              "mkl_amd": blas.STATE, "family": "26/2"}
        assert bench.cpu_facts(str(tmp_path / "missing"))["vector"] == []


def test_the_row_carries_the_curation_section_with_its_paired_gains(tmp_path):
    import json

    def measured(correct):
        return {"accuracy": sum(correct) / len(correct), "per_task": [{"id": f"t{i}", "correct": c} for i, c in enumerate(correct)]}

    stages = tmp_path / "curation" / "stages"
    stages.mkdir(parents=True)
    for name, correct in (("base", [0, 0, 1, 0]), ("unfiltered", [0, 1, 1, 0]), ("curated", [1, 1, 1, 0])):
        (stages / f"{name}.json").write_text(json.dumps(measured(correct)))
    with script_module("bench", "pipeline") as bench:
        cur = bench.sections(tmp_path)["curation"]
        assert cur["accuracy"] == {"base": 0.25, "unfiltered": 0.5, "curated": 0.75}
        vs_unfiltered, vs_base = cur["gains"]["curated − unfiltered"], cur["gains"]["curated − base"]
        assert (vs_unfiltered["gain"], vs_unfiltered["se"]) == (0.25, 0.25)
        assert (vs_base["gained"], vs_base["lost"]) == (2, 0)
        assert bench.sections(tmp_path / "none") == {}


def test_the_row_names_the_environment_that_changed_its_speed_or_floats():
    environ = {"PATH": "/bin", "HOME": "/root", "POSTTRAIN_CACHE": "/c", "POSTTRAIN_PRECISION_PROBE": "fp32=1,bf16=0",
               "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2", "OMP_WAIT_POLICY": "PASSIVE"}
    with script_module("bench", "results_row") as bench:
        # where the cache lives changes nothing measured; the others change the kernels, the precision or the threads
        assert bench.speed_env(environ) == {"MKL_ENABLE_INSTRUCTIONS": "AVX2", "OMP_WAIT_POLICY": "PASSIVE",
                                            "ONEDNN_MAX_CPU_ISA": "AVX2", "POSTTRAIN_PRECISION_PROBE": "fp32=1,bf16=0"}
        assert bench.speed_env({"PATH": "/bin"}) == {}


def test_pooled_result_lines_average_the_runs_not_the_first_one():
    """``--row`` pools recorded runs with new ones: the RL gain over SFT in the RESULT line is the mean of
    the runs' paired gains ± sqrt(Σ se²)/n (it once printed the first run's alone)."""
    def row(sft, rl):
        return {"kind": "default", "gains": {"SFT (after SFT − before)": {"accuracy": {"gain": sft, "se": 0.04}},
                                             "RL (after RL − after SFT)": {"accuracy": {"gain": rl, "se": 0.03}}}}

    with script_module("bench", "pipeline") as bench:
        (line,) = bench.result_lines([row(0.30, 0.02), row(0.20, 0.14)])
    assert line.startswith("RESULT pipeline: +25.0 points")
    assert "smallest gain/paired-se 5.0" in line
    assert "RL +8.0 ± 2.1 points" in line  # sqrt(0.03² + 0.03²) / 2 = 0.0212


def test_rl_vs_control_line_gives_both_the_paired_and_the_between_run_error():
    def table(time_gain, tok_gain):
        return {"comparisons": {
            "RL − SFT same time": {"all": {"gain": time_gain, "se": 0.03}, "arithmetic · story": {"gain": 0.2, "se": 0.05}},
            "RL − SFT same tokens": {"all": {"gain": tok_gain, "se": 0.04}}}}

    with script_module("bench", "pipeline") as bench:
        line = bench.rl_vs_control_line([table(-0.01, 0.03), table(-0.04, 0.075), table(0.02, 0.0)])
        one = bench.rl_vs_control_line([table(-0.01, 0.03)])
    # mean (−1 − 4 + 2)/3 = −1.0; paired sqrt(3 · 0.03²)/3 = 1.7; between runs sd 3.0 / √3 = 1.7
    assert line.startswith("RESULT pipeline_rl_vs_control: -1.0 ± 1.7 (± 1.7 between runs) points")
    assert "mean of 3 run(s)" in line and "beyond +2 se in every run: arithmetic · story" in line
    assert one.startswith("RESULT pipeline_rl_vs_control: -1.0 ± 3.0 points") and "between runs" not in one


def test_rl_vs_control_line_gives_each_domain_and_math_verifys_grade_over_the_runs():
    def gains(arith, math):
        return {"RL − SFT same time": {"all": {"gain": (arith + math) / 2, "se": 0.02},
                                       "arithmetic": {"gain": arith, "se": 0.03}, "math": {"gain": math, "se": 0.03},
                                       "arithmetic · story": {"gain": 0.3, "se": 0.05}}}

    def table(arith, math, mv_math):
        return {"comparisons": gains(arith, math), "math_verify": {"comparisons": gains(arith, mv_math)}}

    with script_module("bench", "pipeline") as bench:
        line = bench.rl_vs_control_line([table(0.10, -0.02, 0.01), table(0.04, -0.05, -0.01)])
    assert "per domain, mean of runs: arithmetic +7.0 ± 2.1 (± 3.0 between runs), math -3.5 ± 2.1" in line
    assert "graded by Math-Verify, RL − SFT same time all" in line and "math +0.0 ± 2.1" in line
    assert "arithmetic · story +30.0" not in line  # wordings are not domains


def test_rl_vs_control_line_adds_the_rejection_sampling_control_only_where_every_run_has_it():
    def table(rft=None):
        comp = {"RL − SFT same time": {"all": {"gain": 0.02, "se": 0.02}, "arithmetic": {"gain": 0.04, "se": 0.03},
                                       "math": {"gain": 0.0, "se": 0.03}}}
        if rft is not None:
            comp["RL − RFT same rollouts"] = {"all": {"gain": rft, "se": 0.02}, "arithmetic": {"gain": 2 * rft, "se": 0.03},
                                              "math": {"gain": 0.0, "se": 0.03}}
        return {"comparisons": comp}

    with script_module("bench", "pipeline") as bench:
        both = bench.rl_vs_control_line([table(0.05), table(0.01)])
        one = bench.rl_vs_control_line([table(0.05), table()])
    # all: mean (5 + 1)/2 = 3.0, paired sqrt(2 · 2²)/2 = 1.4, between sd 2.83/√2 = 2.0; arithmetic 6.0 ± 2.1
    assert "RL − RFT same rollouts all +3.0 ± 1.4 (± 2.0 between runs), arithmetic +6.0 ± 2.1" in both
    assert "RFT" not in one  # a run without the control: no mean over the others


def test_rl_vs_control_line_says_where_rl_is_no_better_than_a_constant_answer():
    def table(flagged):
        return {"comparisons": {"RL − SFT same time": {"all": {"gain": 0.1, "se": 0.02}}},
                "constant_answer": {"math": {"constant": {"answer": "1", "score": 0.25, "n": 200},
                                             "models": {"rl": {"answer": "1", "share": 0.3, "score": 0.24, "flagged": flagged}}}}}

    with script_module("bench", "pipeline") as bench:
        line = bench.rl_vs_control_line([table(True), table(False), table(True)])
        clean = bench.rl_vs_control_line([table(False)])
    assert "RL no better than one constant answer in some run: math (2 of 3 runs)" in line
    assert "constant answer" not in clean


def test_rl_vs_control_line_gives_rl_on_the_questions_no_shortcut_answers():
    def table(gain, se, n):
        return {"comparisons": {"RL − SFT same time": {"all": {"gain": 0.1, "se": 0.02}}},
                "shortcuts": {"lcm": {"pays": {"product": 0.4, "larger number": 0.2}, "n_beyond": n,
                                      "beyond_comparisons": {"RL − SFT same time": {"gain": gain, "se": se}}}}}

    with script_module("bench", "pipeline") as bench:
        line = bench.rl_vs_control_line([table(0.04, 0.02, 70), table(0.0, 0.02, 80)])
        none = bench.rl_vs_control_line([{"comparisons": {"RL − SFT same time": {"all": {"gain": 0.1, "se": 0.02}}}}])
    # mean (4 + 0)/2 = 2.0, paired sqrt(2 · 2²)/2 = 1.4, between sd 2.83/√2 = 2.0
    assert ("lcm questions no shortcut answers (larger number, product; 70/80 tasks), RL − SFT same time "
            "+2.0 ± 1.4 (± 2.0 between runs)") in line
    assert "shortcut" not in none

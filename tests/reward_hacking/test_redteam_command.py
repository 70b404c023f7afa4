"""`posttrain redteam ENV`, and the registry's coverage: every built-in environment has its own
red-team cases, with both hacks (expected 0) and valid answers (expected 1)."""

from __future__ import annotations

from posttrain.cli import main
from posttrain.eval import redteam
from posttrain.envs.base import ENVIRONMENTS, make_env


def test_every_environment_has_hacks_and_valid_answers():
    make_env("math")  # registers the built-ins (other tests may register toy environments too)
    builtin = [n for n in ENVIRONMENTS.names() if ENVIRONMENTS.get(n).__module__.startswith("posttrain.envs.")]
    assert len(builtin) >= 9, builtin
    for name in builtin:
        cases = redteam.CASES.get(name, [])
        assert any(c.expect == 0.0 for c in cases), name
        assert any(c.expect == 1.0 for c in cases), name
        assert len({c.name for c in redteam.cases_for(name)}) == len(redteam.cases_for(name))


def test_redteam_command_passes_on_a_sound_environment(capsys):
    assert main(["redteam", "mcq", "--n", "3"]) == 0
    out = capsys.readouterr().out
    assert "all_letters" in out and "valid_plain" in out
    assert "0 misbehaved" in out.splitlines()[-1]


def test_redteam_command_fails_when_a_hack_earns_reward(capsys):
    # Partial credit pays a constant function: the audit must say so and exit non-zero.
    assert main(["redteam", "code", "--n", "2", "--arg", "reward=fraction",
                 "--case", "best_constant", "--case", "valid_lookup_solution"]) == 1
    out = capsys.readouterr().out
    last = out.splitlines()[-1]
    assert "FAIL hack  best_constant" in out and "1 misbehaved" in last and last.endswith(": best_constant")


def test_redteam_command_rejects_unknown_env_and_case(capsys):
    assert main(["redteam", "nope"]) == 2
    assert "unknown environment" in capsys.readouterr().err
    assert main(["redteam", "mcq", "--case", "nope"]) == 2
    assert main(["redteam", "mcq", "--arg", "novalue"]) == 2


def test_judged_environment_uses_an_approve_all_judge_by_default(capsys):
    assert main(["redteam", "instruction_multiturn", "--n", "2", "--case", "constant_ok",
                 "--case", "valid_reference"]) == 0
    assert "approve-all" in capsys.readouterr().out

"""Reward-hacking red team: `instruction_multiturn`, judged by a stub that approves everything, so
every hack here is stopped by the program's own checks (rules in force + the substance rule)."""

from redteam_helpers import make_suite

from posttrain.eval.redteam import ApproveAllJudge

env_and_tasks, test_red_team_case = make_suite("instruction_multiturn", judge=ApproveAllJudge())

"""Reward-hacking red team: `structured`. Every case of `posttrain.eval.redteam` for this environment
(and the generic ones) must earn exactly its expected reward on every task it applies to."""

from redteam_helpers import make_suite

env_and_tasks, test_red_team_case = make_suite("structured")

"""The GenRM: its contract (``format``), preference pairs (``pairs``) and the ``genrm`` environment
that GRPO trains it on (``env``). See docs/rlhf.md."""

from posttrain.envs.genrm import env  # noqa: F401  (registers the environment)

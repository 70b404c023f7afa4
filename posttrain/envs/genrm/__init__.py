"""The GenRM: its contract (``format``), preference pairs (``pairs``), the ``genrm`` environment
that GRPO trains it on (``env``) and agreement figures (``evaluate``); its red-team cases are with
every environment's, in ``eval/redteam.py``. See docs/rlhf.md."""

from posttrain.envs.genrm import env  # noqa: F401  (registers the environment)

"""The GenRM: its contract (``format``), preference pairs (``pairs``), the ``genrm`` environment
that GRPO trains it on (``env``), its red-team cases (``redteam``) and agreement figures
(``evaluate``). See docs/rlhf.md."""

from posttrain.envs.genrm import env  # noqa: F401  (registers the environment)
from posttrain.envs.genrm import redteam  # noqa: F401  (registers its red-team cases)

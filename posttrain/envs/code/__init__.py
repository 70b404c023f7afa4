"""Code environment (docs/recipe.md §2.2): ``tasks.py`` has the offline task families, ``env.py``
the environment and its verifier (tests run in ``posttrain/sandbox/``)."""

from posttrain.envs.code.env import CodeEnv

__all__ = ["CodeEnv"]

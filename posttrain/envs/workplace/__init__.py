"""Workplace assistant environment (docs/recipe.md §2.7): see ``env.py`` for the design."""

from posttrain.envs.workplace.env import WorkplaceEnv

__all__ = ["WorkplaceEnv"]

"""Banking customer-service environment with a simulated user (docs/recipe.md §2.7): see ``env.py``."""

from posttrain.envs.banking.env import BankingEnv

__all__ = ["BankingEnv"]

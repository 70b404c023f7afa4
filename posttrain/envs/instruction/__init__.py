"""Instruction following: verifiable constraints (``env``) and multi-turn with an LLM judge
(``multiturn``). Importing the package registers both environments."""

from posttrain.envs.instruction import env, multiturn  # noqa: F401

"""Multi-teacher on-policy distillation (MOPD, docs/recipe.md §3): the RL stage with a teacher
scorer (``scorers/teachers.py``) and the ``mopd`` advantage. The entry point is ``stage.py``."""

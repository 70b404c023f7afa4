"""Multi-teacher on-policy distillation (MOPD, RECIPE.md §3): teachers as config, plugged into the RL
loop as a batch scorer (``teachers.TeacherPool``); the stage entry point is ``stage.py``."""

"""Scale-out of the RL stage: Ray actors per role, weight sync, asynchronous sampling.

``controller.py`` runs ``posttrain rl`` in process or on Ray by one config switch
(``scale.backend``); ``workers.py`` has the actors (rollout, verifier, trainer, weight store);
``rollouts.py`` the rollout source the RL stage samples through on Ray, synchronous or ahead of the
trainer with bounded staleness; ``weight_sync.py`` the weight-sync backends (object store,
checkpoint files, NCCL through vLLM's weight-transfer engine). Design and evidence: docs/scale.md.
"""

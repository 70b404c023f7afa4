"""Samplers: a model behind the ``Generator`` interface (prompts in, token ids + log-probs out).

``hf`` samples in process from live weights (CPU), ``vllm_engine`` drives vLLM, ``openai_compat``
any OpenAI-compatible server; ``registry`` picks one by name. Engines know nothing about
environments or episodes (enforced by import-linter): those sit one layer up, in ``episodes/``.
"""

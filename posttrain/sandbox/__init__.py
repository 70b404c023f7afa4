"""Run untrusted Python (model-written code) in contained, short-lived processes: the design is in
``host.py``'s docstring and docs/sandbox.md. It imports no environment: the ``code`` environment
and the HumanEval benchmark are its callers.
"""

from posttrain.sandbox.host import (CHILD_ENV, DEVICES, EXIT_MEMORY, EXIT_SETUP, MAX_VALUE_REPR, PRELOAD, SLOT_SPAN,
                                    STATE_DIR, SYSTEM_PATHS, UID_BASE, CallOutcome, CallsResult, ExecResult, Limits,
                                    Sandbox, SandboxUnavailable, Status, classify, default_sandbox, parse_call_lines,
                                    root_plan)

__all__ = ["CHILD_ENV", "DEVICES", "EXIT_MEMORY", "EXIT_SETUP", "MAX_VALUE_REPR", "PRELOAD", "SLOT_SPAN", "STATE_DIR",
           "SYSTEM_PATHS", "UID_BASE", "CallOutcome", "CallsResult", "ExecResult", "Limits", "Sandbox",
           "SandboxUnavailable", "Status", "classify", "default_sandbox", "parse_call_lines", "root_plan"]

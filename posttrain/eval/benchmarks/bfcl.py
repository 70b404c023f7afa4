"""BFCL v4 (Berkeley Function Calling Leaderboard), single-turn AST categories, from ``bfcl-eval``.

The wheel ships every category's questions and possible answers under ``bfcl_eval/data``
(``BFCL_v4_<category>.json`` and ``possible_answer/BFCL_v4_<category>.json``, one JSON object a
line). We run the three classic AST categories:

* ``simple_python`` (400; ``simple`` is accepted as its old name): one function, one call;
* ``multiple`` (200): 2–4 functions, one call of the right one;
* ``parallel`` (200): one function, several calls in one reply (any order).

Per item, through our own stack (pure functions, tested without a model):

1. ``to_tool``: the BFCL function doc becomes an OpenAI-format tool, with bfcl-eval's own type
   table (``GORILLA_TO_OPENAPI``: ``dict`` → ``object``, ``float`` → ``number``, ``tuple`` →
   ``array``, ``any`` → ``string``), the same conversion bfcl-eval applies for function-calling
   models. Dotted names (``math.factorial``) are kept: our tool-call format allows them.
2. The question's messages are rendered with our chat template and the tools (``chat_template``:
   the tools' JSON in the system prompt and the XML call format).
3. ``decode``: the model's reply is parsed with our parser against those tools
   (``parse_assistant``: schema-directed values) into BFCL's decoded form
   ``[{name: {param: value}}, ...]``; a reply that does not parse is bfcl's "decoder failed".
4. ``check``: bfcl-eval's own ``ast_checker`` (``bfcl_eval.eval_checker.ast_eval.ast_checker``)
   grades it against the possible answers.

Dependencies: ``bfcl-eval`` pins numpy==1.26.4, tree-sitter, openai, anthropic, cohere, mistralai,
google-genai, boto3, sentence-transformers, faiss ... for its model handlers; installing those would
downgrade our numpy and pandas. ``make setup`` installs it with ``--no-deps``: its data and its AST
checker need none of them. The checker's module imports ``constants.model_config`` (which imports
every API handler) for one lookup, whether a model's tool names had their dots turned into
underscores; ``_checker`` registers a stand-in module with that one entry for our model
(``underscore_to_dot=False``: our names keep their dots), before importing the checker. The
checker's code itself is bfcl-eval's, unchanged.
"""

from __future__ import annotations

import copy
import json
import sys
import types
from dataclasses import dataclass, replace
from typing import Any

from posttrain.eval.benchmarks.base import (
    Benchmark,
    BenchmarkOptions,
    BenchmarkResult,
    generate_texts,
    proportion_se,
    require,
)

PACKAGE = "bfcl-eval"
CATEGORIES = ("simple_python", "multiple", "parallel")
ALIASES = {"simple": "simple_python"}
MODEL_NAME = "posttrain"  # the name the checker is told (only its underscore_to_dot entry matters)


def category_name(name: str) -> str:
    name = ALIASES.get(name, name)
    if name not in CATEGORIES:
        raise ValueError(f"unknown BFCL category {name!r}; known: {', '.join(CATEGORIES)} (simple = simple_python)")
    return name


def _read_jsonl(path: Any) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def load_category(category: str, n: int | None = None) -> list[dict[str, Any]]:
    """The category's entries in file order (the first ``n`` if given), each with its
    ``ground_truth`` (the possible answers) joined by id."""
    from importlib.resources import files

    require("bfcl_eval", PACKAGE)
    category = category_name(category)
    data = files("bfcl_eval") / "data"
    entries = _read_jsonl(data / f"BFCL_v4_{category}.json")
    answers = {a["id"]: a["ground_truth"] for a in _read_jsonl(data / "possible_answer" / f"BFCL_v4_{category}.json")}
    entries = entries[:n] if n is not None else entries
    return [{**e, "ground_truth": answers[e["id"]]} for e in entries]


# --------------------------------------------------------------------------- conversion (pure)


def _convert_schema(spec: dict[str, Any], mapping: dict[str, str]) -> dict[str, Any]:
    """One BFCL parameter schema in JSON-Schema types (nested ``properties`` and ``items`` too)."""
    out = dict(spec)
    t = out.get("type")
    if t is None:
        out["type"] = "string"
    else:
        if t == "float":
            out["format"] = "float"
            out["description"] = (out.get("description") or "") + " This is a float type value."
        out["type"] = mapping.get(t, "string")
    if isinstance(out.get("properties"), dict):
        out["properties"] = {k: _convert_schema(v, mapping) for k, v in out["properties"].items()}
    if isinstance(out.get("items"), dict):
        out["items"] = _convert_schema(out["items"], mapping)
    return out


def to_tool(function: dict[str, Any]) -> dict[str, Any]:
    """A BFCL function doc as an OpenAI-format tool (``{"type": "function", "function": ...}``), the
    types mapped with bfcl-eval's ``GORILLA_TO_OPENAPI``. Pure."""
    mapping = require("bfcl_eval.constants.type_mappings", PACKAGE).GORILLA_TO_OPENAPI
    fn = copy.deepcopy(function)
    params = fn.get("parameters") or {}
    params = {**params, "type": "object",
              "properties": {k: _convert_schema(v, mapping) for k, v in (params.get("properties") or {}).items()}}
    return {"type": "function", "function": {**fn, "parameters": params}}


def prompt_messages(entry: dict[str, Any]) -> list[dict[str, Any]]:
    """The question's messages (single-turn categories: the one turn)."""
    return [{"role": m["role"], "content": m["content"]} for m in entry["question"][0]]


@dataclass
class Decoded:
    calls: list[dict[str, dict[str, Any]]] | None  # BFCL's decoded form; None: the reply did not parse
    error: str = ""


def decode(text: str, tools: list[dict[str, Any]]) -> Decoded:
    """A reply's XML tool calls, parsed by our parser against ``tools``, in BFCL's decoded form
    ``[{name: {param: value}}, ...]``. Pure."""
    from posttrain.models.chat_template import ToolCallParseError, parse_assistant

    try:
        turn = parse_assistant(text, tools)
    except ToolCallParseError as e:
        return Decoded(None, e.reason)
    return Decoded([{c.name: dict(c.arguments)} for c in turn.tool_calls])


def _checker() -> Any:
    """bfcl-eval's ``ast_checker``, imported with the stand-in ``model_config`` (module docstring)."""
    require("bfcl_eval", PACKAGE)
    name = "bfcl_eval.constants.model_config"
    module = sys.modules.get(name)
    if module is None:
        module = types.ModuleType(name, "posttrain's stand-in: the one entry the AST checker reads "
                                        "(bfcl's real module imports every API model handler)")
        module.MODEL_CONFIG_MAPPING = {}  # type: ignore[attr-defined]
        sys.modules[name] = module
    module.MODEL_CONFIG_MAPPING.setdefault(MODEL_NAME, types.SimpleNamespace(underscore_to_dot=False))
    return require("bfcl_eval.eval_checker.ast_eval.ast_checker", PACKAGE)


def check(entry: dict[str, Any], category: str, decoded: Decoded) -> dict[str, Any]:
    """bfcl-eval's verdict ``{"valid": bool, "error": [...], "error_type": str}`` on one decoded
    reply, as its eval runner computes it (decoder failure and wrong output shape first)."""
    if decoded.calls is None:
        return {"valid": False, "error": [f"our parser: {decoded.error}"], "error_type": "ast_decoder:decoder_failed"}
    ast = _checker()
    enums = require("bfcl_eval.constants.enums", PACKAGE)
    result = ast.ast_checker(entry["function"], decoded.calls, entry["ground_truth"], enums.Language.PYTHON,
                             category_name(category), MODEL_NAME)
    return {"valid": bool(result["valid"]), "error": list(result.get("error", [])),
            "error_type": result.get("error_type", "")}


def grade_reply(entry: dict[str, Any], category: str, text: str) -> dict[str, Any]:
    """Convert, parse, check: the whole per-item path on one reply text. Pure."""
    tools = [to_tool(f) for f in entry["function"]]
    decoded = decode(text, tools)
    return {**check(entry, category, decoded), "decoded": decoded.calls}


def upper_95(acc: float, n: int) -> float | None:
    """With no item right the standard error says nothing: the exact one-sided 95 % upper bound of
    the accuracy, 1 - 0.05^(1/n) (about 3/n). None when some item is right. Pure."""
    return 1 - 0.05 ** (1 / n) if acc == 0 and n else None


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Accuracy per category (with its binomial standard error), the unweighted mean of the
    categories, and the counts of bfcl's error types. Pure."""
    out: dict[str, Any] = {"categories": {}}
    accs = []
    for category in dict.fromkeys(r["category"] for r in records):
        rows = [r for r in records if r["category"] == category]
        acc = sum(r["valid"] for r in rows) / len(rows)
        accs.append(acc)
        errors: dict[str, int] = {}
        for r in rows:
            if not r["valid"]:
                errors[r["error_type"]] = errors.get(r["error_type"], 0) + 1
        out["categories"][category] = {"n": len(rows), "accuracy": acc, "se": proportion_se(acc, len(rows)),
                                       "upper_95": upper_95(acc, len(rows)),
                                       "error_types": dict(sorted(errors.items(), key=lambda kv: -kv[1]))}
    if accs:
        ses = [c["se"] for c in out["categories"].values()]
        out["mean_accuracy"] = sum(accs) / len(accs)
        out["mean_accuracy_se"] = (sum(s * s for s in ses) ** 0.5) / len(ses)
    return out


def run(generator: Any, options: BenchmarkOptions) -> BenchmarkResult:
    options = replace(options, k=1)  # BFCL grades one reply per item
    categories = [category_name(c) for c in (options.categories or CATEGORIES)]
    records = []
    for category in categories:
        entries = load_category(category, options.n)
        tools = [[to_tool(f) for f in e["function"]] for e in entries]
        completions = generate_texts(generator, [prompt_messages(e) for e in entries], tools, options)
        for entry, comps in zip(entries, completions):
            c = comps[0]
            verdict = grade_reply(entry, category, c.text)
            records.append({"id": entry["id"], "category": category, **verdict, "finish_reason": c.finish_reason,
                            "reply": c.text})
    settings = {"package": PACKAGE, "categories": categories, "n_per_category": options.n,
                "temperature": options.temperature, "max_new_tokens": options.max_new_tokens,
                "checker": "bfcl_eval.eval_checker.ast_eval.ast_checker.ast_checker (Language.PYTHON)"}
    return BenchmarkResult("bfcl", summarize(records), records, settings)


def result_line(r: BenchmarkResult) -> str:
    cats = r.summary["categories"]
    def one(c: str, v: dict[str, Any]) -> str:
        bound = f", < {100 * v['upper_95']:.1f} at 95 %" if v.get("upper_95") is not None else ""
        return f"{c} {100 * v['accuracy']:.1f} ± {100 * v['se']:.1f} (n={v['n']}{bound})"

    parts = ", ".join(one(c, v) for c, v in cats.items())
    return (f"{100 * r.summary['mean_accuracy']:.1f} ± {100 * r.summary['mean_accuracy_se']:.1f} % AST accuracy "
            f"(mean of {parts})")


BENCHMARKS_HERE = [Benchmark("bfcl", PACKAGE, "BFCL v4 simple/multiple/parallel, bfcl-eval's AST checker",
                             run, result_line)]

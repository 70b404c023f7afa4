"""Synthetic data from a config of columns (``configs/synth.py``; docs/synth.md).

    posttrain synth --config recipes/synth/two_step_qa.yaml --out data/synth_qa.jsonl

A row is built column by column in dependency order (``column_order``: the columns' references
form a DAG, checked before any model loads). For a chunk of ``generation.batch_rows`` rows:

1. samplers draw from ``random.Random(row_seed(seed, "synth", column, row))`` — a row's values do
   not depend on the batch, the attempt or which rows came before;
2. each model column renders its prompt template for every live row of the chunk and makes *one*
   ``Generator.generate`` call for them, each row seeded by (seed, column, row, attempt);
3. each validator column judges every live row; a row failing one drops out of this attempt with
   the reason counted (``<column>:<reason>``), and is tried again (model columns resampled, sampler
   values kept) up to ``max_attempts`` times;
4. accepted rows become conversations (``messages`` templates), pass the final stage (the curation
   filter stack, ``sft_filters.py``, and a global MinHash near-duplicate index, ``dedup.py``), and
   are written in row order.

Resume (``--resume``): every row index processed (accepted or not) is appended to ``<out>.done``
after its row (if any) is written, both fsync'd. A resumed run drops a torn last line and any row
whose index is not in ``.done``, re-seeds the dedup index from the rows kept, and continues at the
first index not done. Chunks are cut from the whole row range, so a resumed chunk is what remained
of the interrupted one; with per-row seeds the output equals an uninterrupted run's byte for byte
(tests/integration/test_synth_run.py kills a run with SIGKILL and checks it).

How it departs from NeMo Data Designer / distilabel: columns are a typed pydantic union and the
whole DAG is validated up front; a retry resamples a row's model columns rather than the whole row;
validators are this project's own (the environments' verifiers, the sandbox, the judge).
"""

from __future__ import annotations

import ast
import json
import operator
import os
import random
import re
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from posttrain.configs.synth import (SAMPLERS, VALIDATORS, AgreementValidator, CategoryColumn, CodeValidator,
                                     EnvTaskColumn, EnvValidator, ExprColumn, IntColumn, JsonSchemaValidator,
                                     JudgeValidator, LengthValidator, ModelColumn, SeedColumn, SynthConfig,
                                     UniformColumn)
from posttrain.errors import UserError

if TYPE_CHECKING:
    from posttrain.engines.base import Generator

FAULT_ENV = "POSTTRAIN_SYNTH_FAULT_AFTER_ROW"  # test hook: SIGKILL the process after N rows are done
Row = dict[str, Any]


class SynthError(UserError, ValueError):
    pass


# --------------------------------------------------------------------------- safe expressions

_BINOPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}
_CMPOPS: dict[type, Callable[[Any, Any], bool]] = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
    ast.Gt: operator.gt, ast.GtE: operator.ge, ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b,
}
_UNARY: dict[type, Callable[[Any], Any]] = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Not: operator.not_}
FUNCTIONS: dict[str, Callable[..., Any]] = {
    "len": len, "min": min, "max": max, "abs": abs, "round": round, "str": str, "int": int, "float": float,
    "lower": lambda s: str(s).lower(), "upper": lambda s: str(s).upper(),
}
MAX_POW = 64  # 9**9**9 would hang the process


def parse_expr(expr: str, where: str = "expr") -> ast.Expression:
    """Parse and check an expression: only the node types ``safe_eval`` knows, calls only of
    ``FUNCTIONS`` by name. Raises ``SynthError`` naming what is refused."""
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError as e:
        raise SynthError(f"{where}: not a valid expression: {e.msg}") from None
    allowed = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.IfExp, ast.Name, ast.Load,
               ast.Constant, ast.Subscript, ast.List, ast.Tuple, ast.Call, ast.And, ast.Or, ast.Slice,
               *_BINOPS, *_CMPOPS, *_UNARY)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            raise SynthError(f"{where}: attribute access ({node.attr!r}) is not allowed")
        if isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS or node.keywords:
                name = node.func.id if isinstance(node.func, ast.Name) else ast.unparse(node.func)
                raise SynthError(f"{where}: call of {name!r} is not allowed (allowed: {', '.join(FUNCTIONS)})")
        elif not isinstance(node, allowed):
            raise SynthError(f"{where}: {type(node).__name__} is not allowed")
    return tree


def expr_names(expr: str) -> set[str]:
    tree = parse_expr(expr)
    calls = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and id(n) not in calls}


def safe_eval(expr: str | ast.Expression, names: dict[str, Any]) -> Any:
    """Evaluate a checked expression over ``names`` by walking its AST (never ``eval``)."""
    tree = parse_expr(expr) if isinstance(expr, str) else expr

    def ev(node: ast.AST) -> Any:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in names:
                raise SynthError(f"unknown name {node.id!r} in expression")
            return names[node.id]
        if isinstance(node, ast.BinOp):
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Pow) and isinstance(right, (int, float)) and abs(right) > MAX_POW:
                raise SynthError(f"exponent {right} is too large (at most {MAX_POW})")
            if isinstance(node.op, ast.Mult) and any(isinstance(v, (str, list, tuple)) for v in (left, right)):
                if any(isinstance(v, int) and v > 10_000 for v in (left, right)):
                    raise SynthError("repetition count too large (at most 10000)")
            return _BINOPS[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp):
            return _UNARY[type(node.op)](ev(node.operand))
        if isinstance(node, ast.BoolOp):
            vals = node.values
            if isinstance(node.op, ast.And):
                out = True
                for v in vals:
                    out = ev(v)
                    if not out:
                        return out
                return out
            out = False
            for v in vals:
                out = ev(v)
                if out:
                    return out
            return out
        if isinstance(node, ast.Compare):
            left = ev(node.left)
            for op, comp in zip(node.ops, node.comparators):
                right = ev(comp)
                if not _CMPOPS[type(op)](left, right):
                    return False
                left = right
            return True
        if isinstance(node, ast.IfExp):
            return ev(node.body) if ev(node.test) else ev(node.orelse)
        if isinstance(node, ast.Subscript):
            return ev(node.value)[ev(node.slice)]
        if isinstance(node, ast.Slice):
            return slice(*(ev(x) if x is not None else None for x in (node.lower, node.upper, node.step)))
        if isinstance(node, (ast.List, ast.Tuple)):
            items = [ev(e) for e in node.elts]
            return items if isinstance(node, ast.List) else tuple(items)
        if isinstance(node, ast.Call):
            return FUNCTIONS[node.func.id](*(ev(a) for a in node.args))  # type: ignore[attr-defined]
        raise SynthError(f"{type(node).__name__} is not allowed")  # parse_expr refused it already

    return ev(tree)


# --------------------------------------------------------------------------- templates

_FIELD = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)((?:\.[A-Za-z0-9_]+)*)\}")


def template_names(template: str) -> set[str]:
    return {m.group(1) for m in _FIELD.finditer(template)}


def render(template: str, values: dict[str, Any]) -> str:
    """``{col}`` / ``{col.key.key}`` replaced by the value (dict keys or list indices only; no
    attributes, unlike ``str.format``). ``{{`` and ``}}`` are literal braces."""

    def one(m: re.Match[str]) -> str:
        value = values[m.group(1)]
        for key in filter(None, m.group(2).split(".")):
            value = value[int(key)] if isinstance(value, list) else value[key]
        return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)

    text = template.replace("{{", "\x00").replace("}}", "\x01")
    return _FIELD.sub(one, text).replace("\x00", "{").replace("\x01", "}")


# --------------------------------------------------------------------------- the DAG


def references(col: Any) -> set[str]:
    if isinstance(col, ModelColumn):
        return template_names(col.prompt) | template_names(col.system or "")
    if isinstance(col, ExprColumn):
        return expr_names(col.expr)
    if isinstance(col, AgreementValidator):
        return set(col.columns)
    if isinstance(col, EnvValidator):
        return {col.column, col.task}
    if isinstance(col, JudgeValidator):
        return {col.column} | ({col.context} if col.context else set())
    if hasattr(col, "column"):
        return {col.column}
    return set()


def column_order(cfg: SynthConfig) -> list[str]:
    """The columns in an order where each comes after those it references (YAML order among
    equals). A missing reference or a cycle raises ``SynthError`` naming the column."""
    deps: dict[str, set[str]] = {}
    for name, col in cfg.columns.items():
        try:
            refs = references(col)
        except SynthError as e:
            raise SynthError(f"column {name!r}: {e}") from None
        for r in sorted(refs):
            if r not in cfg.columns:
                raise SynthError(f"column {name!r} references {r!r}, which is not a column")
            if cfg.columns[r].type in VALIDATORS:
                raise SynthError(f"column {name!r} references validator column {r!r}; validators have no value")
        if name in refs:
            raise SynthError(f"column {name!r} references itself")
        deps[name] = refs
    for col in cfg.columns.values():
        if isinstance(col, EnvValidator) and cfg.columns[col.task].type != "env_task":
            raise SynthError(f"env validator's task {col.task!r} is not an env_task column")
    for i, m in enumerate(cfg.messages):
        for r in sorted(template_names(m.content)):
            if r not in cfg.columns or cfg.columns[r].type in VALIDATORS:
                raise SynthError(f"messages[{i}] references {r!r}, which is not a value column")
    order: list[str] = []
    state: dict[str, int] = {}  # 1: on the stack, 2: placed

    def visit(name: str, path: list[str]) -> None:
        if state.get(name) == 2:
            return
        if state.get(name) == 1:
            cycle = path[path.index(name):] + [name]
            raise SynthError(f"column {name!r} is in a cycle: {' -> '.join(cycle)}")
        state[name] = 1
        for d in sorted(deps[name], key=list(cfg.columns).index):
            visit(d, [*path, name])
        state[name] = 2
        order.append(name)

    for name in cfg.columns:
        visit(name, [])
    return order


# --------------------------------------------------------------------------- samplers


def row_seed(seed: int, *parts: int | str) -> int:
    import hashlib

    digest = hashlib.blake2b(":".join(map(str, (seed, *parts))).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def read_seed_rows(path: Path) -> list[Any]:
    if not path.exists():
        raise SynthError(f"seed file not found: {path}")
    rows = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise SynthError(f"{path}:{i}: not valid JSON: {e.msg}") from None
    if not rows:
        raise SynthError(f"seed file {path} has no rows")
    return rows


def sample_value(name: str, col: Any, rng: random.Random, index: int, values: dict[str, Any], ctx: "Context") -> Any:
    """One sampler column's value for row ``index`` (pure given the rng and the context)."""
    if isinstance(col, CategoryColumn):
        return rng.choices(col.values, weights=col.weights)[0]
    if isinstance(col, UniformColumn):
        return round(rng.uniform(col.low, col.high), col.decimals)
    if isinstance(col, IntColumn):
        return rng.randint(col.low, col.high)
    if isinstance(col, SeedColumn):
        rows = ctx.seed_rows[name]
        row = rows[index % len(rows)] if col.order == "sequential" else rows[rng.randrange(len(rows))]
        if col.field is None:
            return row
        if not isinstance(row, dict) or col.field not in row:
            raise SynthError(f"column {name!r}: a row of {col.path} has no field {col.field!r}")
        return row[col.field]
    if isinstance(col, EnvTaskColumn):
        task = ctx.env_tasks[name][rng.randrange(len(ctx.env_tasks[name]))]
        prompt = next((m["content"] for m in reversed(task.messages) if m.get("role") == "user"), "")
        return {"id": task.id, "prompt": prompt}
    if isinstance(col, ExprColumn):
        try:
            return safe_eval(ctx.exprs[name], values)
        except SynthError as e:
            raise SynthError(f"column {name!r}: {e}") from None
        except Exception as e:  # noqa: BLE001 - a type error in the user's expression
            raise SynthError(f"column {name!r}: {type(e).__name__}: {e}") from None
    raise AssertionError(name)


# --------------------------------------------------------------------------- model output


def strip_reasoning(text: str) -> str:
    from posttrain.models.chat_template import split_reasoning

    return split_reasoning(text)[1].strip()


def parse_json_output(text: str) -> Any:
    """The JSON object or array in a reply (code fences and surrounding prose allowed)."""
    body = re.sub(r"^```(?:json)?\s*|\s*```$", "", text.strip())
    try:
        return json.loads(body)
    except json.JSONDecodeError:
        pass
    for open_, close in (("{", "}"), ("[", "]")):
        i, j = body.find(open_), body.rfind(close)
        if 0 <= i < j:
            try:
                return json.loads(body[i:j + 1])
            except json.JSONDecodeError:
                continue
    raise ValueError("invalid_json")


def schema_errors(value: Any, schema: dict[str, Any]) -> str | None:
    from jsonschema.validators import validator_for

    err = next(iter(validator_for(schema)(schema).iter_errors(value)), None)
    if err is None:
        return None
    where = "/".join(map(str, err.absolute_path)) or "root"
    return f"schema:{where}:{err.validator}"


# --------------------------------------------------------------------------- validators


def words(text: Any) -> list[str]:
    return re.findall(r"\w+", str(text).lower())


def jaccard(a: Any, b: Any) -> float:
    sa, sb = set(words(a)), set(words(b))
    if not sa and not sb:
        return 1.0
    return len(sa & sb) / len(sa | sb)


_FENCE = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.S)


def code_of(text: str) -> str:
    blocks = _FENCE.findall(text)
    return "\n".join(blocks) if blocks else text


def validate(name: str, col: Any, values: dict[str, Any], ctx: "Context") -> str | None:
    """None when the row passes this validator, else the failure reason."""
    if isinstance(col, LengthValidator):
        n = len(words(values[col.column]))
        if n < col.min_words:
            return "too_short"
        if col.max_words is not None and n > col.max_words:
            return "too_long"
        return None
    if isinstance(col, AgreementValidator):
        a, b = (values[c] for c in col.columns)
        return None if jaccard(a, b) >= col.min_jaccard else "disagree"
    if isinstance(col, JsonSchemaValidator):
        value = values[col.column]
        if isinstance(value, str):
            try:
                value = parse_json_output(value)
            except ValueError:
                return "invalid_json"
        return schema_errors(value, col.schema_)
    if isinstance(col, CodeValidator):
        from posttrain.sandbox.host import default_sandbox
        from posttrain.sandbox.results import Limits

        code = code_of(str(values[col.column])) + ("\n" + col.suffix if col.suffix else "")
        res = default_sandbox(col.allow_unisolated).run_program(code, limits=Limits(wall_s=col.wall_s, cpu_s=col.wall_s))
        return None if res.ok else f"sandbox:{res.status.value}"
    if isinstance(col, EnvValidator):
        task = ctx.task_by_id[values[col.task]["id"]]
        env = ctx.envs[ctx.env_of[col.task]]
        result = env.verify(task, [*task.messages, {"role": "assistant", "content": str(values[col.column])}])
        if result.reward >= col.min_reward:
            return None
        return "verifier:" + (result.reason.split(";")[0].strip()[:60] or "reward")
    if isinstance(col, JudgeValidator):
        from posttrain.envs.judge import build_judge_prompt

        msgs = [{"role": "user", "content": str(values[col.context])}] if col.context else []
        msgs.append({"role": "assistant", "content": str(values[col.column])})
        verdict = ctx.judges[name].judge(build_judge_prompt(msgs, col.rubric, None))
        return None if verdict.score >= col.min_score else "judge:low_score"
    raise AssertionError(name)


# --------------------------------------------------------------------------- the run


@dataclass
class Context:
    """What columns need beyond the row: seed rows, environment task pools, compiled expressions."""

    seed_rows: dict[str, list[Any]] = field(default_factory=dict)
    env_tasks: dict[str, list[Any]] = field(default_factory=dict)
    env_of: dict[str, str] = field(default_factory=dict)
    envs: dict[str, Any] = field(default_factory=dict)
    task_by_id: dict[str, Any] = field(default_factory=dict)
    exprs: dict[str, ast.Expression] = field(default_factory=dict)
    judges: dict[str, Any] = field(default_factory=dict)


def check_config(cfg: SynthConfig, base_dir: Path | None = None) -> list[str]:
    """Everything checkable without a model: the DAG, expressions, seed files. Returns the order."""
    order = column_order(cfg)
    for name, col in cfg.columns.items():
        if isinstance(col, SeedColumn):
            path = col.path if col.path.is_absolute() or base_dir is None else base_dir / col.path
            rows = read_seed_rows(path)
            if col.field is not None and not all(isinstance(r, dict) and col.field in r for r in rows):
                raise SynthError(f"column {name!r}: some rows of {path} have no field {col.field!r}")
    return order


def build_context(cfg: SynthConfig, base_dir: Path | None = None, make_judge: Callable[[str], Any] | None = None) -> Context:
    ctx = Context()
    for name, col in cfg.columns.items():
        if isinstance(col, SeedColumn):
            path = col.path if col.path.is_absolute() or base_dir is None else base_dir / col.path
            ctx.seed_rows[name] = read_seed_rows(path)
        elif isinstance(col, ExprColumn):
            ctx.exprs[name] = parse_expr(col.expr, f"column {name!r}")
        elif isinstance(col, EnvTaskColumn):
            from posttrain.envs.base import make_env

            key = col.env + json.dumps(col.args, sort_keys=True)  # one env per name and arguments
            if key not in ctx.envs:
                try:
                    ctx.envs[key] = make_env(col.env, **col.args)
                except KeyError:
                    raise SynthError(f"column {name!r}: unknown environment {col.env!r}") from None
                except (TypeError, ValueError) as e:
                    raise SynthError(f"column {name!r}: bad args for environment {col.env!r}: {e}") from None
            tasks = ctx.envs[key].tasks(col.split, col.pool, cfg.seed)
            ctx.env_tasks[name], ctx.env_of[name] = tasks, key
            ctx.task_by_id.update({t.id: t for t in tasks})
        elif isinstance(col, JudgeValidator):
            if make_judge is None:
                from posttrain.envs.judge import make_judge as make_judge_
                make_judge = make_judge_
            ctx.judges[name] = make_judge(col.judge)
    return ctx


@dataclass
class Tally:
    rows_done: int = 0
    accepted: int = 0
    rejected: int = 0  # no attempt passed every validator
    final_dropped: Counter[str] = field(default_factory=Counter)  # filters / near-duplicates
    failures: Counter[str] = field(default_factory=Counter)  # "<column>:<reason>", per failed attempt
    attempts: Counter[int] = field(default_factory=Counter)  # accepted rows by the attempt that passed
    generated: int = 0  # model calls' completions


def generate_chunk(cfg: SynthConfig, order: Sequence[str], indices: Sequence[int], gen: "Generator", ctx: Context,
                   tally: Tally) -> list[tuple[int, dict[str, Any] | None, int]]:
    """(row index, values or None when every attempt failed, attempts used) for each row."""
    from posttrain.engines.base import SamplingParams

    g = cfg.generation
    values: dict[int, dict[str, Any]] = {i: {} for i in indices}
    static: set[str] = set()  # samplers over samplers only: drawn once per row, a retry keeps them
    for name in order:
        col = cfg.columns[name]
        if col.type in SAMPLERS and references(col) <= static:
            static.add(name)
            for i in indices:
                values[i][name] = sample_value(name, col, random.Random(row_seed(cfg.seed, "synth", name, i)), i,
                                               values[i], ctx)
    done: dict[int, tuple[dict[str, Any] | None, int]] = {}
    for attempt in range(cfg.max_attempts):
        live = [i for i in indices if i not in done]
        if not live:
            break
        for name in order:
            col = cfg.columns[name]
            if not live:
                break
            if col.type in SAMPLERS:
                if name not in static:  # an expression over model columns: each attempt
                    for i in live:
                        values[i][name] = sample_value(name, col, random.Random(row_seed(cfg.seed, "synth", name, i)),
                                                       i, values[i], ctx)
                continue
            if isinstance(col, ModelColumn):
                prompts = []
                for i in live:
                    msgs = [{"role": "system", "content": render(col.system, values[i])}] if col.system else []
                    prompts.append([*msgs, {"role": "user", "content": render(col.prompt, values[i])}])
                params = SamplingParams(max_new_tokens=col.max_new_tokens or g.max_new_tokens,
                                        temperature=g.temperature if col.temperature is None else col.temperature,
                                        top_p=g.top_p, seed=cfg.seed)
                seeds = [row_seed(cfg.seed, "synth", name, i, attempt) for i in live]
                comps = _generate(gen, prompts, params, seeds)
                tally.generated += len(live)
                failed = []
                for i, c in zip(live, comps):
                    text = c[0].text
                    if c[0].finish_reason == "length" and col.output == "json":
                        failed.append((i, "truncated"))
                        continue
                    value: Any = text.strip() if col.reasoning == "keep" else strip_reasoning(text)
                    if col.output == "json":
                        try:
                            value = parse_json_output(value)
                        except ValueError:
                            failed.append((i, "invalid_json"))
                            continue
                        if col.schema_ is not None and (err := schema_errors(value, col.schema_)):
                            failed.append((i, err))
                            continue
                    values[i][name] = value
            else:
                failed = [(i, r) for i in live if (r := validate(name, col, values[i], ctx)) is not None]
            for i, reason in failed:
                tally.failures[f"{name}:{reason}"] += 1
            bad = {i for i, _ in failed}
            live = [i for i in live if i not in bad]
        for i in live:
            done[i] = (values[i], attempt + 1)
    return [(i, *done.get(i, (None, cfg.max_attempts))) for i in indices]


def _generate(gen: Any, prompts: list, params: Any, seeds: list[int]) -> list:
    import inspect

    try:
        takes_seeds = "seeds" in inspect.signature(gen.generate).parameters
    except (TypeError, ValueError):
        takes_seeds = False
    if takes_seeds:
        return gen.generate(prompts, params, seeds=seeds)
    return gen.generate(prompts, params)  # a generator without per-prompt seeds: params.seed for every prompt


def build_row(cfg: SynthConfig, index: int, values: dict[str, Any], attempts: int, model: str) -> Row:
    return {
        "id": f"synth-{cfg.seed}-{index}",
        "row": index,
        "messages": [{"role": m.role, "content": render(m.content, values)} for m in cfg.messages],
        "columns": {k: v for k, v in values.items() if not cfg.columns[k].drop},
        "provenance": {"source": "synth", "model": model, "seed": cfg.seed, "attempts": attempts},
    }


# --------------------------------------------------------------------------- output and resume


def done_path(out: Path) -> Path:
    return out.with_name(out.name + ".done")


def summary_path(out: Path) -> Path:
    return out.with_name(out.stem + ".summary.json")


def _append_synced(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


def _complete_lines(path: Path) -> list[str]:
    """The lines of a file, without a last line a kill cut short (no newline, or not JSON)."""
    if not path.exists():
        return []
    text = path.read_bytes().decode("utf-8", errors="replace")
    lines = text.split("\n")
    tail = lines.pop()  # "" when the file ends with a newline
    del tail
    out = []
    for n, line in enumerate(lines):
        try:
            json.loads(line)
        except json.JSONDecodeError:
            if n == len(lines) - 1:
                break
            raise SynthError(f"{path}:{n + 1}: not valid JSON (not a synth output?)") from None
        out.append(line)
    return out


def check_output(out: Path, resume: bool) -> None:
    exists = out.exists() and out.stat().st_size > 0
    if exists and not resume:
        raise SynthError(f"{out} exists; pass --resume to continue it, or choose another --out")


def config_path(out: Path) -> Path:
    return out.with_name(out.name + ".config.json")


def _identity(cfg: SynthConfig) -> str:
    """The config as JSON without ``rows`` (a resume may ask for more rows, nothing else)."""
    return json.dumps({k: v for k, v in json.loads(cfg.model_dump_json(by_alias=True)).items() if k != "rows"},
                      sort_keys=True)


def check_same_config(cfg: SynthConfig, out: Path) -> None:
    """A resumed run must be the run it continues: same columns, seed, generation and final stage."""
    path = config_path(out)
    if path.exists() and path.read_text(encoding="utf-8") != _identity(cfg):
        raise SynthError(f"{out} was written with another config ({path}); resume with that config, or choose another --out")


def load_progress(out: Path) -> tuple[list[str], int]:
    """Rows written for done indices (repairing the files in place) and the next row index."""
    done = [int(x) for x in _complete_lines(done_path(out))]
    if done != list(range(len(done))):
        raise SynthError(f"{done_path(out)}: row indices are not 0..n-1 in order; not this run's progress file")
    lines = []
    for line in _complete_lines(out):
        row = json.loads(line)
        if not isinstance(row, dict) or "row" not in row:
            raise SynthError(f"{out}: a line has no 'row' field; not synth output")
        if row["row"] < len(done):
            lines.append(line)
    for path, body in ((out, lines), (done_path(out), [str(i) for i in done])):
        text = "".join(x + "\n" for x in body)
        if path.exists() and path.read_text(encoding="utf-8", errors="replace") != text:
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, path)
    return lines, len(done)


class FinalStage:
    """Curation filters, then a global near-duplicate index over the conversations kept."""

    def __init__(self, cfg: SynthConfig) -> None:
        from posttrain.data.sft_filters import FilterStack

        self.filters = FilterStack.from_config(cfg.final.filters) if cfg.final.filters is not None else None
        self.index = self.hasher = None
        if cfg.final.dedup is not None:
            from posttrain.data.dedup import MinHasher, NearDupIndex

            d = cfg.final.dedup
            self.hasher = MinHasher(d.num_perm, d.shingle_size, d.seed)
            self.index = NearDupIndex(self.hasher, d.global_threshold)

    @staticmethod
    def text(row: Row) -> str:
        return "\n".join(str(m["content"]) for m in row["messages"])

    def seed(self, rows: Sequence[Row]) -> None:
        if self.index is not None and rows:
            for r, sig in zip(rows, self.hasher.signatures([self.text(r) for r in rows])):
                self.index.add(r["id"], sig)

    def check(self, row: Row) -> str | None:
        if self.filters is not None and (reason := self.filters.evaluate(row)):
            return f"filter:{reason}"
        if self.index is not None:
            sig = self.hasher.signatures([self.text(row)])[0]
            if self.index.find(sig) is not None:
                return "near_duplicate"
            self.index.add(row["id"], sig)
        return None


def synthesize(cfg: SynthConfig, gen: "Generator", out: Path, *, resume: bool = False, base_dir: Path | None = None,
               model_name: str = "", progress: bool = True, ctx: Context | None = None,
               log: Callable[[str], None] = lambda s: print(s, file=sys.stderr)) -> dict[str, Any]:
    """Run the config (module docstring); returns the summary (also saved as JSON)."""
    t0 = time.time()
    order = check_config(cfg, base_dir)
    check_output(out, resume)
    ctx = ctx or build_context(cfg, base_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    if not resume:
        done_path(out).unlink(missing_ok=True)
    if resume:
        check_same_config(cfg, out)
    lines, start = load_progress(out) if resume else ([], 0)
    out.touch()
    config_path(out).write_text(_identity(cfg), encoding="utf-8")
    final = FinalStage(cfg)
    final.seed([json.loads(x) for x in lines])
    tally = Tally()
    b = cfg.generation.batch_rows
    chunks = [[i for i in range(s, min(s + b, cfg.rows)) if i >= start] for s in range(0, cfg.rows, b)]
    chunks = [c for c in chunks if c]
    fault_after = int(os.environ.get(FAULT_ENV, "-1"))
    log(f"synth: {cfg.rows} rows, {start} already done, writing {out}")
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=cfg.rows, initial=start, unit="row", file=sys.stderr, dynamic_ncols=True)
    for chunk in chunks:
        for index, values, attempts in generate_chunk(cfg, order, chunk, gen, ctx, tally):
            tally.rows_done += 1
            data = b""
            if values is None:
                tally.rejected += 1
            else:
                row = build_row(cfg, index, values, attempts, model_name)
                reason = final.check(row)
                if reason is None:
                    tally.accepted += 1
                    tally.attempts[attempts] += 1
                    data = (json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8")
                else:
                    tally.final_dropped[reason] += 1
            if data:
                _append_synced(out, data)
            _append_synced(done_path(out), f"{index}\n".encode())
            if bar is not None:
                bar.update(1)
                bar.set_postfix(accepted=f"{tally.accepted / tally.rows_done:.0%}")
            if tally.rows_done == fault_after:  # test hook: die as kill -9 would
                os.kill(os.getpid(), signal.SIGKILL)
    if bar is not None:
        bar.close()
    elapsed = time.time() - t0
    summary = {
        "out": str(out), "rows": cfg.rows, "rows_skipped_done": start, "rows_processed": tally.rows_done,
        "accepted": tally.accepted, "rejected": tally.rejected, "final_dropped": dict(tally.final_dropped),
        "failures": dict(tally.failures.most_common()), "accepted_by_attempt": dict(sorted(tally.attempts.items())),
        "completions": tally.generated, "elapsed_s": round(elapsed, 2),
        "rows_per_s": round(tally.rows_done / elapsed, 3) if elapsed > 0 else None,
        "accepted_per_s": round(tally.accepted / elapsed, 3) if elapsed > 0 else None,
        "rows_in_output": len(_complete_lines(out)), "model": model_name,
        "config": json.loads(cfg.model_dump_json(by_alias=True)),
    }
    previous = json.loads(summary_path(out).read_text(encoding="utf-8")) if resume and summary_path(out).exists() else None
    summary["total"] = cumulative(previous, summary, start)
    summary_path(out).write_text(json.dumps(summary, indent=2, ensure_ascii=False), encoding="utf-8")
    log(format_summary(summary))
    return summary


TOTALLED = ("rows_processed", "accepted", "rejected", "completions")
TALLIES = ("final_dropped", "failures")


def cumulative(previous: dict[str, Any] | None, now: dict[str, Any], start: int) -> dict[str, Any]:
    """Counters over every run that wrote this output: this run's plus the previous summary's
    ``total``. ``complete`` is false when the rows found done (``start``) are not exactly the rows the
    previous summaries counted: a run killed before writing its summary leaves its rows uncounted."""
    prev = (previous or {}).get("total") or {k: 0 for k in (*TOTALLED, "runs")} | {k: {} for k in TALLIES} | {"complete": True}
    counted = prev["rows_processed"]
    total: dict[str, Any] = {k: prev[k] + now[k] for k in TOTALLED}
    for k in TALLIES:
        merged = Counter(prev[k])
        merged.update(now[k])
        total[k] = dict(merged.most_common())
    total["runs"] = prev["runs"] + 1
    total["complete"] = bool(prev["complete"]) and counted == start
    return total


def format_summary(s: dict[str, Any]) -> str:
    lines = [f"synth: {s['rows_processed']} rows processed ({s['rows_skipped_done']} done before), "
             f"{s['accepted']} accepted, {s['rejected']} rejected after every attempt, "
             f"{sum(s['final_dropped'].values())} dropped by the final stage; {s['rows_per_s']} rows/s"]
    for reason, n in list(s["failures"].items())[:8]:
        lines.append(f"  failed attempts  {reason:<40} {n:>6}")
    for reason, n in s["final_dropped"].items():
        lines.append(f"  final stage      {reason:<40} {n:>6}")
    t = s.get("total")
    if t and t["runs"] > 1:
        lines.append(f"  over all {t['runs']} runs into this output: {t['rows_processed']} rows, {t['accepted']} accepted, "
                     f"{t['rejected']} rejected, {sum(t['final_dropped'].values())} dropped"
                     + ("" if t["complete"] else " (a run stopped before its summary: its rows are not counted)"))
    lines.append(f"  output: {s['out']} ({s['rows_in_output']} rows), summary: {summary_path(Path(s['out']))}")
    return "\n".join(lines)

"""The config of ``posttrain synth`` (``data/synth.py``; docs/synth.md): a dataset as columns.

A synthetic dataset is a mapping from column name to column spec, in YAML order. Every column is
a tagged union keyed on ``type``, so a misspelt field or type fails when the config loads, before
any model does:

* samplers — ``category`` (values with weights), ``uniform`` (float range), ``int`` (integer
  range), ``seed`` (a row of a seed JSONL, optionally one field of it), ``env_task`` (a task drawn
  from an environment; its verifier can validate the row), ``expr`` (a safe expression over other
  columns);
* ``model`` — a prompt template over other columns (``{name}`` / ``{name.field}``), answered by
  the run's generator; free text or JSON validated against a JSON schema; reasoning kept or
  stripped;
* validators — ``json_schema``, ``code`` (a column's code must run in ``posttrain/sandbox``),
  ``env`` (an environment's verifier on a model column, given an ``env_task`` column), ``judge``
  (an LLM judge's score), ``length`` (word bounds), ``agreement`` (two model columns agree).

A row is accepted when every validator passes; otherwise its model columns are sampled again, up
to ``max_attempts`` times. Which columns reference which is checked as a DAG by
``data/synth.py:column_order`` (a missing reference or a cycle is one line naming the column).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import Field, model_validator

from posttrain.configs.base import StrictModel
from posttrain.configs.curate import DedupConfig, FiltersConfig


def _check_schema(schema: dict[str, Any]) -> None:
    from jsonschema.exceptions import SchemaError
    from jsonschema.validators import validator_for

    try:
        validator_for(schema).check_schema(schema)
    except SchemaError as e:
        where = "/".join(map(str, e.absolute_path)) or "root"
        raise ValueError(f"not a valid JSON schema at {where}: {e.message}") from None


class _Column(StrictModel):
    drop: bool = Field(False, description="computed but left out of the output row's `columns`")


class CategoryColumn(_Column):
    """One of ``values``, drawn with ``weights`` (uniform when omitted)."""

    type: Literal["category"]
    values: list[Any] = Field(min_length=1, description="the categories")
    weights: list[float] | None = Field(None, description="relative weights, one per value (>= 0, not all 0)")

    @model_validator(mode="after")
    def _weights(self) -> "CategoryColumn":
        if self.weights is not None:
            if len(self.weights) != len(self.values):
                raise ValueError(f"{len(self.weights)} weights for {len(self.values)} values")
            if any(w < 0 for w in self.weights) or sum(self.weights) <= 0:
                raise ValueError("weights must be >= 0 and not all 0")
        return self


class UniformColumn(_Column):
    """A float drawn uniformly from [low, high], rounded to ``decimals``."""

    type: Literal["uniform"]
    low: float
    high: float
    decimals: int = Field(3, ge=0, le=12)

    @model_validator(mode="after")
    def _range(self) -> "UniformColumn":
        if self.high < self.low:
            raise ValueError(f"high {self.high} < low {self.low}")
        return self


class IntColumn(_Column):
    """An integer drawn uniformly from [low, high] (both included)."""

    type: Literal["int"]
    low: int
    high: int

    @model_validator(mode="after")
    def _range(self) -> "IntColumn":
        if self.high < self.low:
            raise ValueError(f"high {self.high} < low {self.low}")
        return self


class SeedColumn(_Column):
    """A row of a seed JSONL (drawn at random, or in order with ``order: sequential``)."""

    type: Literal["seed"]
    path: Path = Field(description="JSONL of objects; relative paths are relative to the config file")
    field: str | None = Field(None, description="take this field of the row (default: the whole object)")
    order: Literal["random", "sequential"] = "random"


class EnvTaskColumn(_Column):
    """A task of an environment (its prompt text is ``{col.prompt}``); an ``env`` validator grades
    a model column against it with the environment's own verifier."""

    type: Literal["env_task"]
    env: str = Field(description="environment registry name, e.g. instruction")
    split: Literal["train", "dev", "test"] = "train"
    pool: int = Field(500, ge=1, description="tasks drawn from the environment; each row picks one at random")
    args: dict[str, Any] = Field(default_factory=dict,
                                 description="the environment's own arguments, e.g. {min_constraints: 1, max_constraints: 2}")


class ExprColumn(_Column):
    """A safe expression over other columns: arithmetic, comparisons, boolean ops, ``x if c else
    y``, subscripts, literals and the functions ``len min max abs round str int float lower upper``.
    No attributes, no other calls, no comprehensions (``data/synth.py:safe_eval``)."""

    type: Literal["expr"]
    expr: str = Field(min_length=1)


class ModelColumn(_Column):
    """The generator's answer to ``prompt`` (a template over other columns), optionally after a
    ``system`` message."""

    type: Literal["model"]
    prompt: str = Field(min_length=1, description="user message template: {column} or {column.field}")
    system: str | None = Field(None, description="system message template")
    output: Literal["text", "json"] = Field("text", description="json: the answer must parse as JSON (and match `schema`)")
    schema_: dict[str, Any] | None = Field(None, alias="schema", description="JSON schema for output: json")
    reasoning: Literal["keep", "strip"] = Field("strip", description="keep: the <think> block stays in the value")
    temperature: float | None = Field(None, ge=0, description="overrides generation.temperature")
    max_new_tokens: int | None = Field(None, ge=1, description="overrides generation.max_new_tokens")

    @model_validator(mode="after")
    def _schema(self) -> "ModelColumn":
        if self.schema_ is not None:
            if self.output != "json":
                raise ValueError("schema needs output: json")
            _check_schema(self.schema_)
        return self


class JsonSchemaValidator(_Column):
    type: Literal["json_schema"]
    column: str = Field(description="the column whose value (JSON text or object) is checked")
    schema_: dict[str, Any] = Field(alias="schema")

    @model_validator(mode="after")
    def _schema(self) -> "JsonSchemaValidator":
        _check_schema(self.schema_)
        return self


class CodeValidator(_Column):
    """The column's text (code fences removed) must run to exit 0 in the sandbox."""

    type: Literal["code"]
    column: str
    suffix: str = Field("", description="code appended after the column's, e.g. asserts")
    wall_s: float = Field(5.0, gt=0, le=60)
    allow_unisolated: bool = Field(False, description="run even where the sandbox cannot isolate (not root)")


class EnvValidator(_Column):
    """The environment's verifier on ``column`` as the reply to ``task``'s prompt."""

    type: Literal["env"]
    column: str
    task: str = Field(description="an env_task column")
    min_reward: float = Field(1.0, ge=0, le=1)


class JudgeValidator(_Column):
    type: Literal["judge"]
    column: str
    judge: str = Field(description="judge model spec or http://host:port/v1[#model]")
    rubric: str = "The response is correct, helpful and complete for the request."
    context: str | None = Field(None, description="the request the column answers (a column name)")
    min_score: float = Field(0.7, ge=0, le=1)


class LengthValidator(_Column):
    type: Literal["length"]
    column: str
    min_words: int = Field(1, ge=0)
    max_words: int | None = Field(None, ge=1)


class AgreementValidator(_Column):
    """Two columns agree: word-set Jaccard >= ``min_jaccard`` (1.0 with ``exact``: equal after
    normalising case and whitespace). The two-step recipe's self-consistency check."""

    type: Literal["agreement"]
    columns: list[str] = Field(min_length=2, max_length=2)
    min_jaccard: float = Field(0.5, ge=0, le=1)


Column = Annotated[
    Union[CategoryColumn, UniformColumn, IntColumn, SeedColumn, EnvTaskColumn, ExprColumn, ModelColumn,
          JsonSchemaValidator, CodeValidator, EnvValidator, JudgeValidator, LengthValidator, AgreementValidator],
    Field(discriminator="type"),
]
SAMPLERS = ("category", "uniform", "int", "seed", "env_task", "expr")
VALIDATORS = ("json_schema", "code", "env", "judge", "length", "agreement")


class Message(StrictModel):
    role: Literal["system", "user", "assistant"]
    content: str = Field(description="template over the columns")


class GenerationConfig(StrictModel):
    model: str = Field("embedded", description="model spec (embedded, a checkpoint dir), http(s)://host:port/v1[#model], or vllm:SPEC")
    temperature: float = Field(0.8, ge=0)
    top_p: float = Field(0.95, gt=0, le=1)
    max_new_tokens: int = Field(256, ge=1)
    batch_rows: int = Field(8, ge=1, description="rows generated together (one engine call per model column)")


class FinalConfig(StrictModel):
    """The curation filters and global near-duplicate removal as a last stage over accepted rows."""

    filters: FiltersConfig | None = Field(default_factory=FiltersConfig, description="null: no filters")
    dedup: DedupConfig | None = Field(default_factory=DedupConfig, description="null: no dedup")


class SynthConfig(StrictModel):
    rows: int = Field(ge=1, description="rows to attempt (accepted rows are at most this many)")
    seed: int = 0
    max_attempts: int = Field(3, ge=1, le=100, description="tries per row before it is rejected")
    columns: dict[str, Column] = Field(min_length=1)
    messages: list[Message] = Field(min_length=1, description="the output conversation, templates over columns")
    generation: GenerationConfig = Field(default_factory=GenerationConfig)
    final: FinalConfig = Field(default_factory=FinalConfig)

    @model_validator(mode="after")
    def _names(self) -> "SynthConfig":
        import re

        for name in self.columns:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise ValueError(f"column name {name!r}: letters, digits and _ only")
        if self.messages[-1].role != "assistant":
            raise ValueError("the last message must be the assistant's (the trained turn)")
        return self

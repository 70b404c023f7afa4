"""SFT data curation: generate, verify, filter, pick diverse, write with provenance (docs/recipe.md §1).

    posttrain curate --env instruction --teacher embedded --n 8 --k 2 --out data/sft_instr.jsonl
    posttrain curate --prompts prompts.jsonl --judge http://localhost:8000/v1 \\
        --teacher big=http://localhost:8001/v1 --teacher small=embedded --out data/chat.jsonl

For every prompt (a ``Task``: an environment task, or a row ``{"id", "messages", ...}``):

1. ``generate_fn`` returns N candidates, each recording its teacher and sampling parameters. With
   the CLI it is a ``GeneratingTeacherPool``: N is split across the named ``Generator``s
   round-robin, and tool environments are rolled out turn by turn through
   ``Environment.start_episode``.
2. The filter stack (``sft_filters.py``: truncation, malformed tool calls, repetition, keywords,
   length) runs first, then the domain verifier (``Environment.verify`` or the LLM judge), which
   keeps a candidate when ``reward >= min_reward``. The recipe lists the verifier first; the two
   commute (a row must pass both) and the cheap filters go first so no judge call or test run is
   spent on a malformed or looping candidate. Drops are counted by the first check that failed.
3. ``Deduper.select`` keeps at most K per prompt: near-duplicates removed (within the prompt and
   against every row already written), the rest chosen for diversity (``dedup.py``).
4. Optional reasoning transforms (``transforms.py``: reasoning off, budget truncation), seeded per
   prompt, so a resumed run transforms the same rows the same way.
5. The kept rows of the prompt are appended to the output in one ``write`` — a kill never leaves half
   a prompt — and the prompt id goes into ``<out>.done`` (prompts with nothing kept are done too).

Every candidate ends up either kept or counted under one drop reason (``filter:<filter>:<reason>``,
``rejected``, ``invalid_row``, ``near_duplicate``, ``near_duplicate_global``, ``over_k``); the summary
(printed, and saved as ``<out stem>.summary.json`` with the earlier runs' summaries) also breaks
candidates down by teacher and domain.

Modes:
* fresh: the output must not exist yet;
* ``resume``: prompts already in the output (or in ``<out>.done``) are skipped and the rows already
  written seed the global near-duplicate index; a trailing half-written line or an incomplete prompt
  block (fewer rows than its ``provenance.prompt_rows``) is removed first and that prompt redone.
  Samples are seeded per task (``GeneratingTeacherPool``), so the result equals an uninterrupted
  run; a file curate did not write is refused untouched;
* ``refresh``: the same pipeline with a new teacher pool, merged into the existing output. A prompt's
  old rows compete with its new candidates under the same filters, dedup and K (new rows win ties,
  ``prefer_new``); old rows of prompts not in this run are carried through the global dedup as they
  are. The merged dataset is built in ``<out>.refresh`` (itself resumable) and replaces the output
  only when complete.

Each output row: the prompt messages plus the generated ones (assistant turns parsed into
``reasoning_content`` / ``content`` / structured ``tool_calls``), the prompt's ``tools``, and
``id``, ``prompt_id``, ``task_id``, ``domain``, ``provenance`` {teacher, sampling, reward,
verify_reason, finish_reason, round, prompt_messages, prompt_rows}.
"""

from __future__ import annotations

import json
import inspect
import os
import secrets
import signal
import sys
import time
import zlib
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

from posttrain.configs.curate import CurateConfig
from posttrain.errors import UserError

if TYPE_CHECKING:
    from posttrain.envs.base import Environment, Task, VerifyResult
    from posttrain.engines.base import Generator, SamplingParams

Message = dict[str, Any]
Row = dict[str, Any]

REJECTED = "rejected"
FAULT_ENV = "POSTTRAIN_FAULT_AFTER_PROMPT"  # test hook: SIGKILL the process after writing N prompts
INVALID_ROW = "invalid_row"


class CurateError(UserError, ValueError):
    pass


# --------------------------------------------------------------------------- candidates


@dataclass
class Candidate:
    """One generated continuation of a prompt and where it came from."""

    messages: list[Message]  # the generated part only: assistant turns and observations between them
    teacher: str
    sampling: dict[str, Any] = field(default_factory=dict)
    finish_reason: str = "stop"
    row: Row | None = None  # set for a row carried over from an existing output (refresh): already verified


GenerateFn = Callable[[list["Task"]], list[list[Candidate]]]
VerifyFn = Callable[["Task", list[Message]], "VerifyResult"]


def as_task(item: Any, where: str = "prompt") -> "Task":
    """A ``Task`` from a Task or a row ``{"id", "messages", "domain"?, "ground_truth"?, "tools"?,
    "metadata"?, "env"?}`` (``env`` names the environment that verifies it)."""
    from posttrain.envs.base import Task

    if isinstance(item, Task):
        return item
    if not isinstance(item, dict):
        raise CurateError(f"{where}: expected an object, got {type(item).__name__}")
    for key in ("id", "messages"):
        if key not in item:
            raise CurateError(f"{where}: missing field {key!r}")
    if not isinstance(item["messages"], list) or not item["messages"]:
        raise CurateError(f"{where}: field 'messages' must be a non-empty list")
    metadata = dict(item.get("metadata") or {})
    if item.get("env"):
        metadata["env"] = item["env"]
    return Task(id=str(item["id"]), domain=str(item.get("domain") or item.get("env") or "unknown"),
                messages=item["messages"], ground_truth=item.get("ground_truth"),
                tools=item.get("tools"), metadata=metadata)


def read_prompts(path: str | Path) -> list["Task"]:
    from posttrain.data.conversations import iter_jsonl

    if not Path(path).exists():
        raise CurateError(f"prompts file not found: {path}")
    tasks = []
    for lineno, line in iter_jsonl(path):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise CurateError(f"{path}:{lineno}: not valid JSON: {e.msg}") from None
        tasks.append(as_task(row, f"{path}:{lineno}"))
    return tasks


# --------------------------------------------------------------------------- output paths


def summary_path(out: Path) -> Path:
    return out.with_name(out.stem + ".summary.json")


def done_path(target: Path) -> Path:
    return target.with_name(target.name + ".done")


def refresh_path(out: Path) -> Path:
    return out.with_name(out.name + ".refresh")


# --------------------------------------------------------------------------- output file


def append_block(path: Path, rows: Sequence[Row]) -> None:
    """Append rows with one O_APPEND write (a prompt's rows land together or not at all)."""
    data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8")
    if not data:
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        view = memoryview(data)
        while view:  # a short write only happens on a full disk; finish it or raise
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def append_done(target: Path, prompt_id: str) -> None:
    with open(done_path(target), "a", encoding="utf-8") as f:
        f.write(json.dumps(prompt_id) + "\n")


# A row as ``build_row`` writes it: ``json.dumps`` keeps key order, so every line starts like this
ROW_START = '{"id": '


@dataclass
class _Scan:
    """What an existing output holds, read without changing it (``scan_output``)."""

    rows: list[Row]
    torn: bool  # the last line is cut (a kill mid-write)
    incomplete: set[Any]  # prompt ids whose block has fewer rows than its provenance.prompt_rows
    listed: set[str]  # prompt ids in <target>.done
    done_torn: bool  # the last line of <target>.done is cut


def _not_curate_row(row: Any) -> str | None:
    """Why a parsed line is not a row curate wrote, or None."""
    if not isinstance(row, dict):
        return f"a JSON {type(row).__name__}, not an object"
    missing = [k for k in ("id", "prompt_id", "messages", "provenance") if k not in row]
    if missing:
        return "no " + ", ".join(repr(k) for k in missing)
    prov = row["provenance"]
    if not isinstance(row["messages"], list) or not isinstance(prov, dict) \
            or not all(isinstance(prov.get(k), int) for k in ("prompt_messages", "prompt_rows")):
        return "no provenance.prompt_messages / provenance.prompt_rows"
    return None


def scan_output(path: Path) -> _Scan:
    """Read an output (and its ``.done`` list) without writing anything; raises ``CurateError`` if
    it is not curate output or is corrupt (before, ``--resume`` on a plain JSONL file rewrote it as
    a "torn tail" and then crashed on a missing field).

    Curate output: every line a row with curate's fields; only the last line may be cut, and a cut
    line is the start of such a row. Bytes that are not UTF-8 are a cut line at the end (a kill can
    cut a multi-byte character) and corruption anywhere else.
    """
    from posttrain.data.conversations import not_utf8

    text = path.read_bytes().decode("utf-8", errors="surrogateescape") if path.exists() else ""
    lines = text.split("\n")
    last = max((i for i, x in enumerate(lines) if x.strip()), default=-1)
    refuse = (f"{path} is not curate output, so it cannot be resumed or refreshed (nothing was changed); "
              "give --out a new file, or the output of an earlier curate run")
    rows: list[Row] = []
    torn = False
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        problem = not_utf8(line)
        row: Any = None
        if problem is None:
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                problem = f"not valid JSON ({e.msg})"
        if problem is not None:
            if i != last:
                raise CurateError(f"{path}:{i + 1}: {problem}; the file is corrupt")
            if not (line.startswith(ROW_START) or ROW_START.startswith(line)):
                raise CurateError(f"{path}:{i + 1}: {problem} and not the start of a curate row; {refuse}")
            torn = True
            continue
        why = _not_curate_row(row)
        if why is not None:
            raise CurateError(f"{path}:{i + 1}: {why}; {refuse}")
        rows.append(row)
    counts = Counter(r["prompt_id"] for r in rows)
    expected: dict[Any, int] = {}
    for r in rows:
        expected[r["prompt_id"]] = max(expected.get(r["prompt_id"], 0), r["provenance"]["prompt_rows"])
    incomplete = {pid for pid, n in counts.items() if n < expected[pid]}
    listed: set[str] = set()
    done_torn = False
    dp = done_path(path)
    if dp.exists():
        done_lines = [x for x in dp.read_bytes().decode("utf-8", errors="surrogateescape").split("\n") if x.strip()]
        for j, x in enumerate(done_lines):
            try:
                pid = json.loads(x)
            except json.JSONDecodeError:
                pid = None
            if not isinstance(pid, str) or not_utf8(x):
                if j != len(done_lines) - 1:
                    raise CurateError(f"{dp}:{j + 1}: not a JSON string (a prompt id); the file is corrupt")
                done_torn = True  # cut by a kill: the prompt is in the output, or is redone
                continue
            listed.add(pid)
    return _Scan(rows, torn, incomplete, listed, done_torn)


def load_output(path: Path) -> tuple[list[Row], set[str]]:
    """Rows of complete prompt blocks and the done prompt ids; repairs a torn tail in place.

    A last line that is cut or not JSON (a kill mid-write) and prompt blocks with fewer rows than
    their ``provenance.prompt_rows`` are removed (the file is rewritten atomically), so those prompts
    are generated again. A bad line elsewhere is corruption, not a torn write: it raises. So does a
    file that is not curate output, before anything is written (``scan_output``).
    """
    scan = scan_output(path)
    rows, incomplete = scan.rows, scan.incomplete
    if scan.torn or incomplete:
        rows = [r for r in rows if r["prompt_id"] not in incomplete]
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
        os.replace(tmp, path)
        print(f"curate: removed a torn tail from {path} ({len(incomplete)} incomplete prompt(s) will be redone)",
              file=sys.stderr)
    done = {str(r["prompt_id"]) for r in rows}
    if scan.done_torn or scan.listed & incomplete:
        # a cut last id, or the kill came after the rows but before the id: keep both in step
        dp = done_path(path)
        tmp = dp.with_name(dp.name + ".tmp")
        tmp.write_text("".join(json.dumps(p) + "\n" for p in sorted(scan.listed - incomplete)), encoding="utf-8")
        os.replace(tmp, dp)
    return rows, done | (scan.listed - incomplete)


# --------------------------------------------------------------------------- rows


def _normalize_assistant(msg: Message, tools: list[dict[str, Any]] | None = None) -> Message:
    """Raw generated text → reasoning_content / content / structured tool_calls (left as is if it
    does not parse: only reachable with the tool_calls filter turned off). ``tools`` (the task's)
    keeps string arguments as the exact text the model wrote."""
    from posttrain.models.chat_template import ToolCallParseError, parse_assistant

    if msg.get("role") != "assistant" or msg.get("tool_calls") or msg.get("reasoning_content") is not None:
        return msg
    try:
        return parse_assistant(msg.get("content") or "", tools).to_message()
    except ToolCallParseError:
        return msg


def build_row(task: "Task", cand: Candidate, row_id: str, round_: int) -> Row:
    row: Row = {
        "id": row_id,
        "prompt_id": task.id,
        "task_id": task.id,
        "domain": task.domain,
        "messages": [*task.messages, *cand.messages],
        "provenance": {
            "teacher": cand.teacher,
            "sampling": cand.sampling,
            "finish_reason": cand.finish_reason,
            "round": round_,
            "prompt_messages": len(task.messages),
        },
    }
    if task.tools:
        row["tools"] = task.tools
    return row


def _content_text(m: Message) -> str:
    from posttrain.models.chat_template import ToolCallParseError, assistant_text

    if m.get("role") == "assistant":
        try:
            return assistant_text(m)
        except ToolCallParseError:  # unparsable structured arguments (tool_calls filter off)
            pass
    return str(m.get("content") or "")


def prompt_text(messages: Sequence[Message]) -> str:
    """What makes a prompt this prompt for dedup: everything but the (shared) system prompt."""
    return "\n".join(_content_text(m) for m in messages if m.get("role") != "system")


def response_text(row: Row) -> str:
    n = (row.get("provenance") or {}).get("prompt_messages", 0)
    return "\n".join(_content_text(m) for m in row["messages"][n:])


def _reason_label(reason: str) -> str:
    return (reason or "no_reason").split(";")[0].split(":")[0].strip()[:60]


# --------------------------------------------------------------------------- the pipeline


class _Tally:
    def __init__(self) -> None:
        self.candidates = 0
        self.carried = 0
        self.kept = 0
        self.dropped: Counter[str] = Counter()
        self.rejected_reasons: Counter[str] = Counter()
        self.by_teacher: dict[str, Counter[str]] = defaultdict(Counter)
        self.by_domain: dict[str, Counter[str]] = defaultdict(Counter)
        self.transforms: Counter[str] = Counter()
        self.prompts_done = 0
        self.prompts_with_rows = 0

    def seen(self, cand: Candidate, domain: str) -> None:
        self.candidates += 1
        self.carried += cand.row is not None
        self.by_teacher[cand.teacher]["candidates"] += 1
        self.by_domain[domain]["candidates"] += 1

    def drop(self, reason: str) -> None:
        self.dropped[reason] += 1

    def keep(self, cand: Candidate, domain: str) -> None:
        self.kept += 1
        self.by_teacher[cand.teacher]["kept"] += 1
        self.by_domain[domain]["kept"] += 1


class _Pipeline:
    """The per-prompt steps, sharing the filter stack, the deduper and the tally."""

    def __init__(self, verify_fn: VerifyFn, cfg: CurateConfig, round_: int) -> None:
        from posttrain.data.dedup import Deduper
        from posttrain.data.sft_filters import FilterStack

        self.verify_fn = verify_fn
        self.cfg = cfg
        self.round = round_
        self.stack = FilterStack.from_config(cfg.filters)
        self.deduper = Deduper(cfg.dedup)
        self.tally = _Tally()

    def _accept(self, task: "Task", cand: Candidate, j: int) -> Row | None:
        """Filters, then the verifier; the finished row, or None (the drop is counted)."""
        from posttrain.data.conversations import validate_row

        if cand.row is not None:  # carried over: verified when it was first kept
            row = cand.row
            reason = self.stack.check(row)
            if reason is not None:
                self.tally.drop(f"filter:{reason}")
                return None
            return row
        row = build_row(task, cand, f"{task.id}#{self.round}.{j}", self.round)
        reason = self.stack.check(row)
        if reason is not None:
            self.tally.drop(f"filter:{reason}")
            return None
        result = self.verify_fn(task, cand.messages)
        if result.reward < self.cfg.min_reward:
            self.tally.drop(REJECTED)
            self.tally.rejected_reasons[_reason_label(result.reason)] += 1
            return None
        self.tally.by_teacher[cand.teacher]["verified"] += 1
        n = len(task.messages)
        row["messages"] = row["messages"][:n] + [_normalize_assistant(m, task.tools) for m in row["messages"][n:]]
        row["provenance"].update(reward=result.reward, verify_reason=result.reason)
        try:
            validate_row(row)
        except ValueError:
            self.tally.drop(INVALID_ROW)
            return None
        return row

    def _transform(self, task_id: str, rows: list[Row], fresh: list[bool]) -> list[Row]:
        from posttrain.data.transforms import apply_reasoning_transforms

        if not (self.cfg.reasoning_off_frac or self.cfg.budget_frac):
            return rows
        seed = zlib.crc32(f"{self.cfg.seed}:{task_id}".encode())  # per prompt: resume-stable
        new = apply_reasoning_transforms([r for r, f in zip(rows, fresh) if f], seed,
                                         self.cfg.reasoning_off_frac, self.cfg.budget_frac)
        it = iter(new)
        out = [next(it) if f else r for r, f in zip(rows, fresh)]
        for r, f in zip(out, fresh):
            if f and r.get("reasoning") is False:
                self.tally.transforms["reasoning_off"] += 1
            elif f and r.get("budget_truncated"):
                self.tally.transforms["budget_truncated"] += 1
        return out

    def prompt(self, task: "Task", cands: Sequence[Candidate]) -> list[Row]:
        """All steps for one prompt; returns the rows to write (possibly none)."""
        accepted: list[tuple[Candidate, Row]] = []
        for j, c in enumerate(cands):
            self.tally.seen(c, task.domain)
            row = self._accept(task, c, j)
            if row is not None:
                accepted.append((c, row))
        sign = -1 if self.cfg.prefer_new else 1

        def preference(i: int) -> tuple[float, int, int]:
            prov = accepted[i][1]["provenance"]
            return -float(prov.get("reward", 0.0)), sign * int(prov.get("round", 0)), i

        order = sorted(range(len(accepted)), key=preference)
        sel = self.deduper.select([r["id"] for _, r in accepted], prompt_text(task.messages),
                                  [response_text(r) for _, r in accepted], order, self.cfg.k)
        for reason in sel.dropped.values():
            self.tally.drop(reason)
        rows = []
        for i in sel.kept:
            cand, row = accepted[i]
            self.tally.keep(cand, task.domain)
            rows.append(row)
        rows = self._transform(task.id, rows, [accepted[i][0].row is None for i in sel.kept])
        for r in rows:
            r["provenance"]["prompt_rows"] = len(rows)
        self.tally.prompts_done += 1
        self.tally.prompts_with_rows += bool(rows)
        return rows


def _task_of_row(row: Row) -> "Task":
    from posttrain.envs.base import Task

    n = (row.get("provenance") or {}).get("prompt_messages", 0)
    return Task(id=str(row["prompt_id"]), domain=str(row.get("domain") or "unknown"),
                messages=row["messages"][:n], tools=row.get("tools"))


def _carried(rows: Iterable[Row]) -> dict[str, list[Candidate]]:
    by_prompt: dict[str, list[Candidate]] = defaultdict(list)
    for r in rows:
        prov = r.get("provenance") or {}
        by_prompt[str(r["prompt_id"])].append(Candidate(
            messages=r["messages"][prov.get("prompt_messages", 0):], teacher=str(prov.get("teacher", "unknown")),
            sampling=prov.get("sampling") or {}, finish_reason=prov.get("finish_reason", "stop"), row=r))
    return by_prompt


def _seed_index(pipe: _Pipeline, rows: Sequence[Row]) -> None:
    pipe.deduper.add_existing([r["id"] for r in rows],
                              [prompt_text(r["messages"][:(r.get("provenance") or {}).get("prompt_messages", 0)])
                               for r in rows],
                              [response_text(r) for r in rows])


def check_output(cfg: CurateConfig, scan: bool = True) -> None:
    """Whether ``cfg.out`` suits the mode: fresh needs no output, refresh needs one, and an output
    to resume or refresh must be curate's (``scan_output``). Reads only; the CLI calls it before
    loading any teacher."""
    out = Path(cfg.out)
    exists = out.exists() and out.stat().st_size > 0
    if exists and not (cfg.resume or cfg.refresh):
        raise CurateError(f"{out} exists; pass --resume to continue it or --refresh to merge new teachers into it")
    if cfg.refresh and not exists:
        raise CurateError(f"--refresh needs an existing output; {out} is missing or empty")
    if exists and scan:
        scan_output(out)
        if cfg.refresh and refresh_path(out).exists():
            scan_output(refresh_path(out))


def curate(
    prompts: Iterable[Any],
    generate_fn: GenerateFn,
    verify_fn: VerifyFn,
    cfg: CurateConfig,
    log: Callable[[str], None] = lambda s: print(s, file=sys.stderr),
) -> dict[str, Any]:
    """Run the pipeline (see the module docstring); returns the run summary (also saved as JSON)."""
    t0 = time.time()
    tasks = [as_task(p, f"prompt {i}") for i, p in enumerate(prompts)]
    dup = [tid for tid, n in Counter(t.id for t in tasks).items() if n > 1]
    if dup:
        raise CurateError(f"duplicate prompt id(s): {', '.join(dup[:5])}; ids must be unique")
    out = Path(cfg.out)
    check_output(cfg, scan=False)  # load_output scans (and refuses a file curate did not write) below
    out.parent.mkdir(parents=True, exist_ok=True)

    old_done: set[str] = set()
    if cfg.refresh:
        old_rows, old_done = load_output(out)
        target = refresh_path(out)
        partial_rows, done = load_output(target)
        round_ = 1 + max((int((r.get("provenance") or {}).get("round", 0)) for r in old_rows), default=0)
        carried = _carried(r for r in old_rows if str(r.get("prompt_id")) not in done)
        if partial_rows or done:
            log(f"curate: continuing the refresh in {target} ({len(done)} prompts done)")
    else:
        target = out
        if not cfg.resume:
            done_path(out).unlink(missing_ok=True)  # a stale list from an earlier, deleted output
        partial_rows, done = load_output(out) if cfg.resume else ([], set())
        round_ = max((int((r.get("provenance") or {}).get("round", 0)) for r in partial_rows), default=0)
        carried = {}

    target.touch()  # an output exists even if no prompt keeps anything
    pipe = _Pipeline(verify_fn, cfg, round_)
    _seed_index(pipe, partial_rows)
    todo = [t for t in tasks if t.id not in done]
    log(f"curate: {len(tasks)} prompts, {len(tasks) - len(todo)} already done, writing {target}")
    # Batches are cut from the whole prompt list, then the done prompts are left out, so a resumed
    # batch is what remained of the interrupted one rather than a new mix (samples are seeded per
    # task, see GeneratingTeacherPool; equal batches also keep the engine's padded shapes, hence its
    # floats)
    b = cfg.batch_prompts
    chunks = [c for c in ([t for t in tasks[i:i + b] if t.id not in done] for i in range(0, len(tasks), b)) if c]
    fault_after = int(os.environ.get(FAULT_ENV, "-1"))
    written = 0
    for chunk in chunks:
        generated = generate_fn(chunk)
        if len(generated) != len(chunk):
            raise CurateError(f"generate_fn returned {len(generated)} candidate lists for {len(chunk)} prompts")
        for task, cands in zip(chunk, generated):
            rows = pipe.prompt(task, [*cands, *carried.pop(task.id, [])])
            append_block(target, rows)
            append_done(target, task.id)
            written += 1
            if written == fault_after:  # test hook: die as a kill -9 would, mid-batch if N says so
                os.kill(os.getpid(), signal.SIGKILL)
        t = pipe.tally
        log(f"curate: {t.prompts_done}/{len(todo)} prompts, {t.candidates} candidates, {t.kept} kept")
    if cfg.refresh:  # prompts of the old output that this run did not cover keep their rows, deduped
        for pid, cands in carried.items():
            append_block(target, pipe.prompt(_task_of_row(cands[0].row), cands))  # type: ignore[arg-type]
            append_done(target, pid)
        _, refreshed_done = load_output(target)
        os.replace(target, out)
        done_path(out).write_text("".join(json.dumps(p) + "\n" for p in sorted(old_done | refreshed_done)),
                                  encoding="utf-8")
        done_path(target).unlink(missing_ok=True)

    summary = _summary(pipe, cfg, tasks, todo, out, time.time() - t0)
    _save_summary(out, summary)
    log(format_summary(summary))
    return summary


def _summary(pipe: _Pipeline, cfg: CurateConfig, tasks: list, todo: list, out: Path, elapsed: float) -> dict[str, Any]:
    t = pipe.tally
    assert t.candidates == t.kept + sum(t.dropped.values()), "every candidate is kept or dropped once"
    return {
        "mode": "refresh" if cfg.refresh else "resume" if cfg.resume else "fresh",
        "out": str(out),
        "round": pipe.round,
        "prompts": len(tasks),
        "prompts_skipped_done": len(tasks) - len(todo),
        "prompts_processed": t.prompts_done,
        "prompts_with_rows": t.prompts_with_rows,
        "candidates": t.candidates,
        "carried_over": t.carried,
        "kept": t.kept,
        "dropped": dict(t.dropped.most_common()),
        "rejected_reasons": dict(t.rejected_reasons.most_common(20)),
        "by_teacher": {k: dict(v) for k, v in sorted(t.by_teacher.items())},
        "by_domain": {k: dict(v) for k, v in sorted(t.by_domain.items())},
        "transforms": dict(t.transforms),
        "rows_in_output": sum(1 for line in open(out, encoding="utf-8") if line.strip()) if out.exists() else 0,
        "elapsed_s": round(elapsed, 2),
        "config": json.loads(cfg.model_dump_json()),
    }


def _save_summary(out: Path, summary: dict[str, Any]) -> None:
    path = summary_path(out)
    history: list[dict[str, Any]] = []
    if path.exists():
        try:
            prev = json.loads(path.read_text(encoding="utf-8"))
            history = [*prev.get("history", []), {k: v for k, v in prev.items() if k != "history"}]
        except (json.JSONDecodeError, AttributeError):
            history = []
    path.write_text(json.dumps({**summary, "history": history}, indent=2, ensure_ascii=False), encoding="utf-8")


def format_summary(s: dict[str, Any]) -> str:
    lines = [
        f"curation ({s['mode']}, round {s['round']}): {s['prompts_processed']} prompts processed "
        f"({s['prompts_skipped_done']} skipped as done), {s['prompts_with_rows']} with rows",
        f"  candidates {s['candidates']:>8}" + (f"  (incl. {s['carried_over']} carried over)" if s["carried_over"] else ""),
        f"  kept       {s['kept']:>8}",
    ]
    for reason, n in s["dropped"].items():
        lines.append(f"  - {reason:<40} {n:>8}")
    if s["rejected_reasons"]:
        lines.append("  rejected by the verifier, top reasons: "
                     + ", ".join(f"{r} ({n})" for r, n in list(s["rejected_reasons"].items())[:5]))
    lines.append(f"  {'teacher':<24} {'candidates':>10} {'verified':>9} {'kept':>6}")
    for name, c in s["by_teacher"].items():
        lines.append(f"  {name[:24]:<24} {c.get('candidates', 0):>10} {c.get('verified', 0):>9} {c.get('kept', 0):>6}")
    if s["transforms"]:
        lines.append("  transforms: " + ", ".join(f"{k} {v}" for k, v in s["transforms"].items()))
    lines.append(f"  output: {s['out']} ({s['rows_in_output']} rows), summary: {summary_path(Path(s['out']))}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- teachers


class GeneratingTeacherPool:
    """``generate_fn`` over named ``Generator``s: N candidates per prompt, split round-robin.

    Single-turn tasks: one ``generate`` call per teacher for the whole chunk (n samples a prompt).
    Tool environments (``env.multi_turn``): every candidate is an episode played by the shared
    rollout loop (``rollout.multiturn.run_episodes``: lock-step, one batched call per turn, each
    assistant turn fed to ``Episode.step``). An episode that ends any other way than the
    environment's ``done`` keeps its finish reason (``max_turns``, ``length``, ``context``) so the
    ``truncated`` filter drops it.
    """

    def __init__(
        self,
        teachers: Sequence[tuple[str, "Generator"]],
        n: int,
        params: "SamplingParams",
        env: "Environment | None" = None,
        max_turns: int = 50,
    ) -> None:
        if not teachers:
            raise CurateError("the teacher pool is empty: give at least one --teacher")
        if n < 1:
            raise CurateError(f"n must be at least 1, got {n}")
        self.teachers = list(teachers)
        self.n = n
        self.params = params
        self.env = env
        self.max_turns = max_turns

    def shares(self) -> list[int]:
        t = len(self.teachers)
        return [self.n // t + (i < self.n % t) for i in range(t)]

    def __call__(self, tasks: list["Task"]) -> list[list[Candidate]]:
        from posttrain.engines.hf import row_seed

        out: list[list[Candidate]] = [[] for _ in tasks]
        base = self.params.seed if self.params.seed is not None else secrets.randbits(62)
        for (name, gen), n_t in zip(self.teachers, self.shares()):
            if n_t == 0:
                continue
            params = replace(self.params, n=n_t)
            sampling = asdict(params)
            if self.env is not None and self.env.multi_turn:  # episodes are seeded by task id already
                for i, cands in enumerate(self._episodes(gen, tasks, params)):
                    out[i] += [replace(c, teacher=name, sampling=sampling) for c in cands]
                continue
            # Each prompt's samples are seeded by (seed, teacher, task id) and the engine adds the
            # sample index. By default an engine seeds a prompt by its position in the call, so a
            # resumed run (other batches) sampled other rows: 19 rows instead of 18 after kills.
            kwargs: dict[str, Any] = {}
            if _accepts_seeds(gen):
                kwargs["seeds"] = [row_seed(base, "curate", name, t.id) for t in tasks]
            completions = gen.generate([t.messages for t in tasks], params, [t.tools for t in tasks], **kwargs)
            for i, comps in enumerate(completions):
                out[i] += [Candidate([{"role": "assistant", "content": c.text}], name, sampling, c.finish_reason)
                           for c in comps]
        return out

    def _episodes(self, gen: "Generator", tasks: list["Task"], params: "SamplingParams") -> list[list[Candidate]]:
        from posttrain.episodes.multiturn import run_episodes

        assert self.env is not None
        out: list[list[Candidate]] = [[] for _ in tasks]
        index = {t.id: i for i, t in enumerate(tasks)}
        for traj in run_episodes(gen, self.env, tasks, params, max_turns=self.max_turns):
            messages = list(traj.messages)
            # an episode ends on the environment's reply (a user's goodbye); a trained row ends on
            # the model's turn
            while messages and messages[-1].get("role") != "assistant":
                messages.pop()
            finish = "stop" if traj.finish_reason == "done" else traj.finish_reason
            out[index[traj.task.id]].append(Candidate(messages, "", {}, finish))
        return out


def _accepts_seeds(gen: Any) -> bool:
    """Whether ``gen.generate`` takes per-prompt ``seeds`` (the local engines do). An HTTP teacher
    sends the one ``params.seed`` with every prompt, which does not depend on the batch either."""
    try:
        return "seeds" in inspect.signature(gen.generate).parameters
    except (TypeError, ValueError):
        return False


VLLM_SERVER = "vllm-server:"
"""A teacher spec's prefix for a model served by a ``vllm serve`` this process starts (.venv-vllm)."""


def make_teacher(spec: str, batch_size: int = 32) -> tuple[str, "Generator"]:
    """``[name=]SPEC``: ``http(s)://host:port/v1[#model]`` → OpenAI-compatible server;
    ``vllm-server:MODEL`` → ``MODEL`` served by a ``vllm serve`` subprocess that lives as long as the
    generator (engines/vllm_server.py; ``batch_size`` requests in flight); anything else is a model
    spec for ``posttrain.models.loading`` (``embedded``, a directory, ...) sampled in process."""
    name, sep, rest = spec.partition("=")
    if not sep or "://" in name or name.startswith(VLLM_SERVER):
        name, rest = spec, spec
    if rest.startswith(VLLM_SERVER):
        from posttrain.engines.vllm_server import VLLMServerGenerator

        return name, VLLMServerGenerator.from_spec(rest[len(VLLM_SERVER):], batch_size=batch_size)
    if rest.startswith(("http://", "https://")):
        from posttrain.engines.openai_compat import OpenAIGenerator

        # curation and synth keep a teacher's text only: log-probs would be work for the server and bytes on the wire
        return name, OpenAIGenerator.from_spec(rest, logprobs=False)
    from posttrain.engines.hf import HFGenerator  # heavy (torch): only when a local teacher is asked for

    return name, HFGenerator.from_spec(rest)


# --------------------------------------------------------------------------- verifiers


def judge_verifier(judge: Any, rubric: str) -> VerifyFn:
    """An LLM judge as a verifier: reward = judge score in [0, 1]; reference = a string ground truth."""
    from posttrain.envs.base import VerifyResult
    from posttrain.envs.judge import build_judge_prompt

    def verify(task: "Task", messages: list[Message]) -> "VerifyResult":
        reference = task.ground_truth if isinstance(task.ground_truth, str) else None
        verdict = judge.judge(build_judge_prompt([*task.messages, *messages], rubric, reference))
        return VerifyResult(verdict.score, {"judge": verdict.score}, verdict.reason)

    return verify


def routing_verifier(default: VerifyFn | None) -> VerifyFn:
    """Verify by the environment a task names (``metadata.env``), else by ``default``."""
    from posttrain.envs.base import make_env

    envs: dict[str, Any] = {}

    def verify(task: "Task", messages: list[Message]) -> "VerifyResult":
        name = task.metadata.get("env")
        if name:
            if name not in envs:
                envs[name] = make_env(name)
            return envs[name].verify(task, messages)
        if default is None:
            raise CurateError(f"prompt {task.id!r} names no env and no --judge was given: nothing can verify it")
        return default(task, messages)

    return verify


DEFAULT_RUBRIC = ("The response is correct, helpful and complete for the user's request, follows every "
                  "instruction in the conversation, and is written clearly.")

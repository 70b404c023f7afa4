"""Conversation rows → training examples: render with the chat template, tokenize, cut to a length,
and count what the cut did (``LengthReport``, printed, never silent). Shared by SFT, the RL stage's
SFT anchor and the pipeline's held-out loss."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class LengthReport:
    """What cutting rows to ``max_seq_len`` did to one file's rows (printed, never silent)."""

    max_len: int
    rows: int = 0
    no_target: int = 0  # no assistant token at all (nothing to train on, whatever the length)
    prompt_too_long: int = 0  # the first assistant token lies at or past max_len: skipped
    cut: int = 0  # kept, but assistant tokens past max_len are not trained on
    cut_tokens: int = 0
    target_tokens: int = 0  # assistant tokens of the kept rows before the cut
    longest: int = 0

    def lines(self, where: str) -> list[str]:
        L, out = self.max_len, []
        if self.prompt_too_long:
            out.append(f"[data] {where}: {self.prompt_too_long} rows longer than data.max_seq_len={L} before any "
                       "assistant token: skipped")
        if self.cut:
            out.append(f"[data] {where}: {self.cut} rows cut at data.max_seq_len={L} (longest {self.longest} "
                       f"tokens): {self.cut_tokens} of {self.target_tokens} assistant tokens not trained on")
        if self.no_target:
            out.append(f"[data] {where}: {self.no_target} rows with no assistant token to train on: skipped")
        return out


def tokenize_rows(tokenizer: Any, rows: list[dict[str, Any]], max_len: int | None = None
                  ) -> tuple[list[Any], LengthReport]:
    """Render and tokenize ``rows``, cutting each to ``max_len`` tokens; rows left with no trained
    token are skipped, and the report counts every row skipped or cut (see :class:`LengthReport`)."""
    from posttrain.data.packing import Example
    from posttrain.models.chat_template import render

    out = []
    report = LengthReport(max_len or 0, rows=len(rows))
    for r in rows:
        rendered = render(tokenizer, r["messages"], r.get("tools"), reasoning=r.get("reasoning", True))
        ids, mask = rendered.input_ids, rendered.loss_mask
        report.longest = max(report.longest, len(ids))
        if not any(mask):
            report.no_target += 1
            continue
        if max_len is not None and len(ids) > max_len:
            # the loss shifts labels, so a token at position 0 is never a target: count from 1
            if not any(mask[1:max_len]):
                report.prompt_too_long += 1
                continue
            lost = sum(mask[max_len:])
            if lost:
                report.cut += 1
                report.cut_tokens += lost
            report.target_tokens += sum(mask)
            ids, mask = ids[:max_len], mask[:max_len]
        else:
            report.target_tokens += sum(mask)
        out.append(Example(ids, mask))
    return out, report

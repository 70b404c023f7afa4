"""Train, dev and test: one hash rule for every environment and problem set.

* ``train`` — what the model may learn from (SFT rows, RL prompts, curation candidates);
* ``dev``   — what settings are chosen on: learning rates, steps, mixes, the RL run's best
              checkpoint, every "which of these is better" while developing;
* ``test``  — what is reported, and nothing else: no recipe, bench or stage may choose anything by
              its figure (tests/unit/test_splits.py fails a recipe or bench that asks for it outside
              a reporting path).

A task's split is a function of its content key alone (``split_of``): a SHA-256 of the key read as a
number in [0, 1): below ``DEV_FRACTION`` it is dev, below ``DEV_FRACTION + TEST_FRACTION`` test,
else train. So the three are disjoint whatever seed, size or generator stream produced a task, and a
task keeps its split when the task space grows. The dev bucket is the old single ``validation``
bucket of the environments that hashed this way (math, mcq, structured), so their history of what
was tried stays on dev; arithmetic, code, instruction, the tool environments and the GenRM pairs
hashed otherwise before and moved to this rule with the three splits (docs/results/rlvr_vs_sft.md
says what that changes for earlier figures).

A held-out set that arrives as its own file (a Gym validation dataset, GenRM validation pairs) is cut
in two by ``held_out_split``: a salted hash, dev below one half, test above.
"""

from __future__ import annotations

import hashlib
from typing import Literal, get_args

Split = Literal["train", "dev", "test"]
SPLITS: tuple[Split, ...] = get_args(Split)
DEV_FRACTION = 0.1
TEST_FRACTION = 0.1


def _unit(key: str) -> float:
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2**64


def split_of(key: str) -> Split:
    """The split of the task whose content key (or id) is ``key``."""
    u = _unit(key)
    return "dev" if u < DEV_FRACTION else "test" if u < DEV_FRACTION + TEST_FRACTION else "train"


def held_out_split(key: str) -> Split:
    """dev or test for a member of a set that is held out as a whole (half each). The hash is salted:
    a set held out by a bucket of the unsalted hash (GenRM's ``val_frac``) would otherwise all fall
    on one side."""
    return "dev" if _unit(f"held-out:{key}") < 0.5 else "test"


def check_split(split: str) -> Split:
    """``split`` if it is one of the three, else one line that says what to use instead."""
    if split in SPLITS:
        return split  # type: ignore[return-value]
    if split == "validation":
        raise ValueError("split 'validation' is now two: 'dev' (choose settings on it) or 'test' (report it, "
                         "never choose on it)")
    raise ValueError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")

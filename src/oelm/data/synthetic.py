"""Synthetic probe data: multi-query associative recall (MQAR) and induction (copying) sequences.

Every sample is (inputs [T], targets [T]) with targets = IGNORE except at answer positions, so the
loss and the accuracy see only the answers. Generation is vectorized torch from a torch.Generator:
train/val/test draw from independent streams (seed, split) and the train stream skips any sample
that also occurs in an evaluation set, so the splits are disjoint exactly, not just likely.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

IGNORE = -100  # the GPT's cross-entropy ignore_index
FILLER = 0  # MQAR: the token between queries (never a key or a value)
SPLIT_CODES = {"train": 0, "val": 1, "test": 2}


class ProbeOptions(BaseModel):
    """Options of the probe task (`task: probe`, `probe: {kind: mqar, ...}`)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    kind: Literal["mqar", "induction"]
    vocab: int = Field(default=64, ge=8, le=65536)  # the model's vocab_size
    seq_len: int = Field(default=64, ge=4)
    n_pairs: int = Field(default=8, ge=1)  # mqar: key-value pairs in the context
    n_queries: int | None = Field(default=None, ge=1)  # mqar: queried keys (default: every pair)
    min_period: int | None = Field(default=None, ge=2)  # induction: shortest repeated segment
    max_period: int | None = Field(default=None, ge=2)  # induction: longest (default seq_len // 2)
    eval_size: int = Field(default=512, gt=0)  # sequences in each of val and test
    split_seed: int = 0  # seed of the val/test sets, fixed across runs so every arm sees the same
    target_accuracy: float = Field(default=0.9, gt=0, le=1)  # for steps_to_target

    @model_validator(mode="after")
    def _consistent(self) -> ProbeOptions:
        if self.kind == "mqar":
            keys = n_keys(self.vocab)
            if self.n_pairs > keys:
                raise ValueError(
                    f"probe.n_pairs={self.n_pairs} exceeds the {keys} distinct keys of vocab "
                    f"{self.vocab} (keys and values split the vocabulary); raise probe.vocab"
                )
            need = 2 * self.n_pairs + 2 * self.queries
            if self.seq_len < need:
                raise ValueError(
                    f"probe.seq_len={self.seq_len} cannot hold {self.n_pairs} pairs and "
                    f"{self.queries} queries (needs {need}); raise probe.seq_len"
                )
            if self.queries > self.n_pairs:
                raise ValueError(f"probe.n_queries={self.queries} exceeds probe.n_pairs={self.n_pairs}")
        else:
            lo, hi = self.periods
            if not 2 <= lo <= hi < self.seq_len:
                raise ValueError(
                    f"probe periods [{lo}, {hi}] must satisfy 2 <= min_period <= max_period < "
                    f"seq_len ({self.seq_len}); fix probe.min_period/max_period"
                )
            if hi > self.vocab:
                raise ValueError(
                    f"probe.max_period={hi} exceeds probe.vocab={self.vocab} (a segment's tokens "
                    "are distinct so every answer is retrievable); lower it or raise probe.vocab"
                )
        return self

    @property
    def queries(self) -> int:
        """MQAR queries per sequence."""
        return self.n_queries or self.n_pairs

    @property
    def periods(self) -> tuple[int, int]:
        """Induction: (shortest, longest) period of the repeated segment."""
        hi = self.max_period or self.seq_len // 2
        lo = self.min_period or max(2, min(hi, self.seq_len // 8))
        return lo, hi

    @property
    def chance(self) -> float:
        """Accuracy of a uniform guess among the possible answers."""
        return 1.0 / (n_keys(self.vocab) if self.kind == "mqar" else self.vocab)

    def name(self) -> str:
        """Short dataset name for results and report tables, e.g. mqar-v64-t64-p8."""
        if self.kind == "mqar":
            q = f"-q{self.queries}" if self.queries != self.n_pairs else ""
            return f"mqar-v{self.vocab}-t{self.seq_len}-p{self.n_pairs}{q}"
        lo, hi = self.periods
        return f"induction-v{self.vocab}-t{self.seq_len}-L{lo}-{hi}"


def n_keys(vocab: int) -> int:
    """MQAR keys (= values): token 0 is the filler, the rest is split in half."""
    return (vocab - 1) // 2


def split_generator(seed: int, split: str) -> torch.Generator:
    """An independent torch generator per (seed, split) (numpy SeedSequence spawn keys)."""
    state = np.random.SeedSequence(int(seed), spawn_key=(SPLIT_CODES[split],)).generate_state(1, np.uint64)
    return torch.Generator().manual_seed(int(state[0]) >> 1)  # manual_seed takes < 2**63


def _choose(n: int, k: int, universe: int, gen: torch.Generator) -> torch.Tensor:
    """[n, k] distinct draws from range(universe) per row, in random order."""
    return torch.rand(n, universe, generator=gen).argsort(dim=1)[:, :k]


def mqar(opts: ProbeOptions, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """n MQAR rows: k1 v1 .. kN vN, then queries `k v` at random places among filler tokens.

    The target at a query key's position is its value (the next token), elsewhere IGNORE.
    """
    t, pairs, q, keys = opts.seq_len, opts.n_pairs, opts.queries, n_keys(opts.vocab)
    k = _choose(n, pairs, keys, gen) + 1
    v = torch.randint(keys + 1, 2 * keys + 1, (n, pairs), generator=gen)
    x = torch.full((n, t), FILLER, dtype=torch.long)
    x[:, 0 : 2 * pairs : 2], x[:, 1 : 2 * pairs : 2] = k, v
    asked = _choose(n, q, pairs, gen)  # which pairs are queried, in query order
    tail = t - 2 * pairs
    # q sorted distinct starts in range(tail - q), shifted by their rank: starts >= 2 apart.
    starts = _choose(n, q, tail - q, gen).sort(dim=1).values + torch.arange(q) + 2 * pairs
    rows = torch.arange(n)[:, None]
    x[rows, starts], x[rows, starts + 1] = k.gather(1, asked), v.gather(1, asked)
    y = torch.full_like(x, IGNORE)
    y[rows, starts] = v.gather(1, asked)
    return x, y


def induction(opts: ProbeOptions, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """n rows repeating a segment of distinct random tokens with a random period L per row.

    Targets are the next token at every position after the first repeat begins (t >= L): the
    model must find the earlier occurrence of the current token and copy its successor.
    """
    t, (lo, hi) = opts.seq_len, opts.periods
    period = torch.randint(lo, hi + 1, (n, 1), generator=gen)
    segment = _choose(n, hi, opts.vocab, gen)
    full = segment.gather(1, torch.arange(t + 1)[None, :] % period)  # t + 1: inputs and shifted targets
    x, y = full[:, :-1], full[:, 1:].clone()
    y[torch.arange(t)[None, :] < period] = IGNORE
    return x.contiguous(), y


GENERATORS = {"mqar": mqar, "induction": induction}


def generate(opts: ProbeOptions, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """n samples of the probe's kind."""
    return GENERATORS[opts.kind](opts, n, gen)


def _keys(x: torch.Tensor, y: torch.Tensor) -> list[bytes]:
    """Hashable identity of each row (inputs and targets)."""
    both = torch.cat([x, y], dim=1).numpy()
    return [row.tobytes() for row in both]


class ProbeData:
    """Fixed val/test sets from split_seed and a train stream from the run's data seed."""

    def __init__(self, opts: ProbeOptions, train_seed: int) -> None:
        self.opts = opts
        self.gen = split_generator(train_seed, "train")
        self.eval: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self.seen: set[bytes] = set()
        for split in ("val", "test"):
            x, y = self._unique(opts.eval_size, split_generator(opts.split_seed, split))
            self.eval[split] = (x, y)
            self.seen.update(_keys(x, y))

    def _unique(self, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """n samples none of which is in self.seen (redrawn from the same generator)."""
        x, y = generate(self.opts, n, gen)
        for _ in range(1000):
            bad = [i for i, key in enumerate(_keys(x, y)) if key in self.seen]
            if not bad:
                return x, y
            nx, ny = generate(self.opts, len(bad), gen)
            x[bad], y[bad] = nx, ny
        raise RuntimeError("the probe's sample space is too small for disjoint splits; raise vocab or seq_len")

    def train_batch(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """n fresh training samples, none of them in val or test."""
        return self._unique(n, self.gen)

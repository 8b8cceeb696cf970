"""The domain of the sequence-layout analysis: its abstract values, and the obligations it defers.

Every value in a ring region is one of:

- `Index`: integer (or boolean) index arithmetic: an affine form per element over the ring coordinate, loop
  variables and the element's own indices (`Dim(d)`), see symbolic.py.
- `Data`: a tensor whose meaning is tracked through its dims. Each dim is
    CONST   the value does not vary along it (a broadcast, or size 1);
    FREE    it varies along it in a way that has nothing to do with tokens (batch, heads, features);
    Tok     it indexes tokens of a block: local token = axis offset + stride * index (several dims may share an
            axis after a reshape); the axis says which block: `hop` ring steps behind this device (0: its own);
    Stack   it indexes a buffer stacked by a loop; the element's abstract value depends on the index (its Var).
  `fn` names the function that maps the tokens (or pairs of tokens) to the data: two Data with the same fn hold the
  same function of their tokens, whichever tokens those are. `agg` marks an aggregate over the other side's tokens
  (a running max, a sum, a softmax-weighted sum: `AggOp` says which), with the set of blocks already folded in
  (`Coverage`).
- `Written`: inside a loop's body, a buffer the loop carries right after the body wrote one slice of it; all the
  body may do with it is hand it to the next iteration (loops.py solves what the buffer holds after the loop).

An `Obligation` (of an `ObligationKind`) is a fact a loop body's analysis assumes of carried values not solved yet,
checked once they are (loops.py).

Reordering the sequence keeps a region's results when each result is a complete function of its own tokens: the
rules of analysis.py only ever build values for which that is proved.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import TYPE_CHECKING

from .symbolic import Aff, Var

if TYPE_CHECKING:
    from jaxlib.mlir import ir

CONST = "const"
FREE = "free"


@dataclass(frozen=True)
class Tok:
    axis: str  # key into Data.axes
    stride: int

    def __str__(self) -> str:
        return f"tok({self.axis}*{self.stride})"


@dataclass(frozen=True)
class Stack:
    var: Var
    size: int

    def __str__(self) -> str:
        return f"stack({self.var}<{self.size})"


@dataclass(frozen=True)
class Axis:
    """Tokens of the block `hop` ring steps behind this device, starting at local token `offset`."""

    hop: Aff
    offset: Aff

    def __str__(self) -> str:
        return f"hop {self.hop} @{self.offset}"


# ---------------------------------------------------------------------------------------------------------------
# Coverage: which tokens of the other side an aggregate has folded in.


@dataclass(frozen=True)
class Cells:
    """A family of token ranges of the other side, relative to the aggregate's home block: for every assignment
    of `vars` (each ranging over [lo, hi], bounds affine in outer variables), the block `hop` steps from the home
    block, local tokens [start, start + size)."""

    hop: Aff
    start: Aff
    size: int
    vars: tuple[tuple[Var, Aff, Aff], ...] = ()

    def __str__(self) -> str:
        bound = "".join(f" for {v} in [{lo}, {hi}]" for v, lo, hi in self.vars)
        return f"{{hop {self.hop}, [{self.start}, +{self.size})}}{bound}"


@dataclass(frozen=True)
class CoverageVar:
    """The unknown coverage of a loop-carried aggregate while its loop body is analysed."""

    name: str

    def family(self) -> str:
        """The loop and role it stands for (loops.py names them cv<loop>_<slot>, sv<loop>_<slot>)."""
        return self.name.rsplit("_", 1)[0]

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class Coverage:
    parts: tuple = ()  # Cells | CoverageVar

    def union(self, other: "Coverage") -> "Coverage":
        return Coverage(self.parts + other.parts)

    def __str__(self) -> str:
        return " u ".join(map(str, self.parts)) if self.parts else "{}"


EMPTY = Coverage()


class AggOp(StrEnum):
    """What an aggregate over the other side's tokens holds, per token t of its home axis (s ranges over the tokens
    folded in so far, its coverage; m is a running max of a score over its own coverage). The merges that keep each
    one an order-free function of the blocks folded in are algebra.py's."""

    SUM = "sum"  # sum over s of term(t, s)
    MUL = "mul"  # product over s of term(t, s)
    MAX = "max"  # max over s of score(t, s)
    MIN = "min"  # min over s of score(t, s)
    AND = "and"  # all over s of a truth value
    OR = "or"  # any over s of a truth value
    SSUM = "ssum"  # the online softmax's rescaled sum: sum over s of exp(score(t, s) - m(t)) * term(t, s)
    DIFF = "diff"  # score(t, s) - m(t), per pair, before its exp
    EXP = "exp"  # exp(score(t, s) - m(t)), per pair: a softmax sum's term before it is summed
    MDIFF = "mdiff"  # m_a(t) - m_b(t), two running maxes of one score (cov and shift_cov)
    SHIFT = "shift"  # exp(m_a(t) - m_b(t)): the factor that rescales a sum from one running max to another
    SSTART = "sstart"  # a softmax sum's start value (a sink's logit) rescaled from the start max: no tokens yet
    FINITE = "finite"  # is_finite of an aggregate (the guard `where(is_finite(m), m, c)` reads)
    UNITFN = "unitfn"  # a predicate of whole units (a chunk's largest position), deciding a skip of that pair
    # The log-sum-exp merges of flash-attention style kernels (logsum.py), where lse(C) = log sum over s in C of
    # exp(score(t, s)), a start pseudo-token of score `start` included where the state began from a constant:
    LSE = "lse"  # lse(C): a block's log-sum-exp, or the running one
    NSUM = "nsum"  # sum over s in C of exp(score(t, s) - lse(C)) * term(t, s): a softmax-normalised output
    LOGSUM = "logsum"  # an intermediate of a merge, in logsum.py's terms (`Agg.form`)


@dataclass(frozen=True)
class Agg:
    """An aggregate over the other side's tokens, per token of the home axis.

    op: what it holds (AggOp). For SSUM the shift subtracted is the running max of the same score over `shift_cov`;
    for SHIFT and MDIFF the two running maxes of `score` are over `cov` and `shift_cov`.

    Infinities are what the analysis's exact arithmetic leaves out, and a running max is -inf wherever every score
    folded in so far is (masked with -inf, no finite start): exp(-inf - -inf) is nan there, and which rows meet it
    depends on what each block holds. `finite`: for MAX, the max is never -inf (a finite start was folded in, or
    it is guarded as where(is_finite(m), m, c)); for DIFF/MDIFF, the max subtracted is. `nan`: for
    EXP/SHIFT, the exponent may be -inf - -inf; only a guard on the result (where(is_finite(s), exp(s - m), 0),
    where(is_finite(m_new), exp(m_old - m_new), 1)) may read it (rules.apply_rule refuses any other reader); for
    LSE/NSUM, the merge's floating-point result differs from the log-sum-exp where the state is still at its start
    (logsum.py), so only a guard on the start (where(isneginf(lse), block, merged)) may read it.
    """

    op: AggOp
    home: str | None  # axis key of the home tokens (None: a reduction over own tokens to a scalar)
    term: int  # fn id of the summed/maxed function (ssum: the weight; shift: unused)
    cov: Coverage
    score: int = 0  # ssum/shift: fn id of the score function
    shift_cov: Coverage = EMPTY  # ssum: the shift's coverage; shift: the target coverage
    finite: bool = False
    nan: bool = False
    # Which running maximum this is, or is shifted by (stabiliser.py): MAX/MIN its own identity; DIFF/EXP/SSUM the
    # maximum subtracted; MDIFF/SHIFT the pair (from, to). None: not known. The fields above say *what* value a max
    # holds (the max of a score over a coverage), which two maxima folded differently share; this one says which
    # op or loop slot computed it. Left out of equality, hashing and every fn key, so no decision depends on it.
    ident: object = field(default=None, compare=False)
    masked: bool = False  # LSE/NSUM: the merge's float result is not the lse where a row's keys are all masked
    form: object = None  # LOGSUM: the value in logsum.py's terms (a `logsum.Value`)
    start: float | None = None  # LSE, NSUM, and a by_lse shift: the start pseudo-token's score
    by_lse: bool = False  # DIFF, EXP, SSUM: the shift is the lse of `score` over its coverage, not the running max

    def __str__(self) -> str:
        extra = f", score {self.score}, shift {self.shift_cov}" if self.op in (AggOp.SSUM, AggOp.SHIFT) else ""
        return f"{self.op}[{self.term}{extra}] over {self.cov}"


# ---------------------------------------------------------------------------------------------------------------
# Values.


@dataclass(frozen=True)
class Index:
    """Integer index arithmetic; `expr` gives each element's value (Dim atoms: the element's indices)."""

    shape: tuple[int, ...]
    expr: Aff

    def __str__(self) -> str:
        return f"index<{self.expr}>"


@dataclass(frozen=True)
class Written:
    """A loop-carried buffer after the body wrote one slice of it."""

    loop: int
    slot: int
    dim: int
    index: Aff
    update: Data
    shape: tuple
    unchanged: bool = False  # the slice the iteration read out of the buffer, written back as it was

    def __str__(self) -> str:
        kept = " (as read)" if self.unchanged else ""
        return f"written[{self.slot}][dim {self.dim} @ {self.index}] = {self.update}{kept}"


_SAME = object()  # Data.with_: a field left as it is


@dataclass(frozen=True)
class Data:
    shape: tuple[int, ...]
    dims: tuple  # CONST | FREE | Tok | Stack per dim
    axes: tuple[tuple[str, Axis], ...] = ()
    fn: int = 0
    agg: Agg | None = None
    # element values of Stack dims: var -> the abstract value of one element (with the var free)
    elements: tuple = field(default=(), compare=True)

    @property
    def axis_map(self) -> dict[str, Axis]:
        return dict(self.axes)

    def tok_dims(self, key: str) -> list[tuple[int, int]]:
        """(dim, stride) of every dim carrying axis `key`."""
        return [(d, r.stride) for d, r in enumerate(self.dims) if isinstance(r, Tok) and r.axis == key]

    @property
    def is_invariant(self) -> bool:
        return not self.axes and self.agg is None and not any(isinstance(r, Stack) for r in self.dims)

    def with_(self, shape=_SAME, dims=_SAME, axes=_SAME, fn=_SAME, agg=_SAME, elements=_SAME) -> "Data":
        """This value with some fields changed (a hot path of the analysis: no dataclasses.replace)."""
        return Data(self.shape if shape is _SAME else shape, self.dims if dims is _SAME else dims,
                    self.axes if axes is _SAME else axes, self.fn if fn is _SAME else fn,
                    self.agg if agg is _SAME else agg, self.elements if elements is _SAME else elements)

    def __str__(self) -> str:
        dims = ", ".join(map(str, self.dims))
        axes = "; ".join(f"{k}: {a}" for k, a in self.axes)
        agg = f"; {self.agg}" if self.agg else ""
        return f"data<[{dims}] {axes} fn {self.fn}{agg}>"


def invariant(shape, fn: int, varying: bool = True) -> Data:
    """A value that does not depend on where tokens sit (weights, constants)."""
    dims = tuple(FREE if varying and n > 1 else CONST for n in shape)
    return Data(tuple(shape), dims, (), fn)


def canonical(value: Data) -> Data:
    """Axis keys renamed after the first dim that carries them ("t0", "t3"), so equal values compare equal."""
    rename, order = {}, []
    for d, role in enumerate(value.dims):
        if isinstance(role, Tok) and role.axis not in rename:
            rename[role.axis] = f"t{d}"
            order.append(role.axis)
    if not rename and not value.axes:
        return value
    amap = value.axis_map
    for key in amap:  # axes without dims (reduced away) keep a stable name
        if key not in rename:
            rename[key] = f"r{len(rename)}"
            order.append(key)
    dims = tuple(Tok(rename[r.axis], r.stride) if isinstance(r, Tok) else r for r in value.dims)
    axes = tuple((rename[k], amap[k]) for k in order if k in amap)
    agg = value.agg
    if agg is not None and agg.home is not None:
        agg = replace(agg, home=rename.get(agg.home, agg.home))
    return Data(value.shape, dims, axes, value.fn, agg, value.elements)


# ---------------------------------------------------------------------------------------------------------------
# Obligations: facts a loop body's analysis assumes about the carried values it does not know yet (their closed
# forms come from that very analysis), each checked once they are solved; one that fails refuses the region.


class ObligationKind(StrEnum):
    HOP = "hop"  # two hops (Affs) name the same block: equal modulo the ring size
    HOP_ANY = "hop-any"  # a hop (Aff) names the same block as one of several (a tuple of Affs)
    EQUAL = "equal"  # two Affs are equal (two token offsets)
    DISJOINT = "disjoint"  # two Coverages share no token (a merge counts each token once)
    SAME_COV = "same-cov"  # two Coverages are the same tokens (sums rescaled to the same running max)


@dataclass
class Obligation:
    """A fact assumed while a loop body was analysed with symbolic carried values, checked once they are solved:
    `kind` of `a` and `b`, refused at `op` (inside `calls`) with `message` where it does not hold."""

    kind: ObligationKind
    a: object
    b: object
    op: "ir.Operation | None"
    message: str
    calls: tuple = ()

"""Every op the ring machinery knows, one entry each (`OPS`): which rule of the sequence-layout analysis reads it,
where hoist-permutations moves a sequence dim through it, whether it holds regions, and what the algebra of
partial aggregates makes of it. The analysis (rules.py, algebra.py, dims.py) and hoist-permutations (hoist.py,
calls.py) read their per-op facts here, so that teaching them an op is one entry.

This module holds facts only, as enums and flags: it imports nothing of the analysis, and the functions each enum
member stands for live with the code that runs them (rules.py maps `Transfer` and `Motion` members to its rules).
An op without an entry is unknown: the analysis refuses it, hoisting stops at it, and its regions are looked at.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable, Mapping


class Transfer(enum.Enum):
    """The analysis rule that reads an op (rules.py: from its operands' abstract values, its results')."""

    CONSTANT = enum.auto()
    IOTA = enum.auto()
    PARTITION_ID = enum.auto()
    ELEMENTWISE = enum.auto()  # tokens must line up; index arithmetic folded; partial aggregates merged (algebra.py)
    BROADCAST = enum.auto()
    TRANSPOSE = enum.auto()
    RESHAPE = enum.auto()
    SLICE = enum.auto()
    DYNAMIC_SLICE = enum.auto()
    DYNAMIC_UPDATE_SLICE = enum.auto()
    CONCATENATE = enum.auto()
    REDUCE = enum.auto()
    DOT = enum.auto()
    IDENTITY = enum.auto()  # passes its operands on (layout re-assertions, barriers, a rounding of the same range)
    CUSTOM_CALL = enum.auto()
    COLLECTIVE_PERMUTE = enum.auto()
    ALL_REDUCE = enum.auto()
    OTHER_COLLECTIVE = enum.auto()
    WHILE = enum.auto()
    BRANCHES = enum.auto()
    NESTED_MANUAL = enum.auto()
    GATHER = enum.auto()
    CALL = enum.auto()
    POSITIONAL = enum.auto()  # only on values that don't follow tokens (`OpInfo.verb` says what it does)


class Motion(enum.Enum):
    """Where hoist-permutations moves a sequence dim of an operand (rules.py's `moves` and `carriers` for each
    member that has them; hoist.py's shortcuts for the others)."""

    SAME_SHAPE = enum.auto()  # operands and results of one shape, elementwise: dim d of each is dim d of the result
    ELEMENTWISE = enum.auto()  # elementwise whose scalar operands broadcast (select's predicate, clamp's bounds)
    WHERE_IT_LIVES = enum.auto()  # one operand, a result of its type: it only says where the value lives
    BROADCAST = enum.auto()
    TRANSPOSE = enum.auto()
    RESHAPE = enum.auto()
    REDUCE = enum.auto()  # a reduced sequence dim is summed away by an order-free body
    DOT = enum.auto()  # batch dims kept, contracted dims summed away with the other side's in the same order
    WHOLE_DIM = enum.auto()  # slice, pad: token-wise along a dim they leave whole
    CONCATENATE = enum.auto()
    GATHER = enum.auto()  # rows of a table follow the indices' tokens
    SCATTER = enum.auto()  # an order-free scatter of per-token rows: the tokens are summed away
    CALL = enum.auto()  # the callee decides (calls.py)
    SOURCE = enum.auto()  # no operands to move: a splat constant or an iota may be in permuted order already
    AS_IS = enum.auto()  # reads its operands in the order they are in (a ring region, a function's return)
    NONE = enum.auto()  # not shown token-wise: the motion stops there


class Regions(enum.Enum):
    """What an op's regions are to the values around it."""

    NONE = enum.auto()  # holds none (the verifier says so)
    NESTED = enum.auto()  # may hold regions whose ops read values defined outside them
    ISOLATED = enum.auto()  # holds regions that read only their own values (a manual computation)


class Algebra(enum.Enum):
    """What the algebra of partial aggregates (algebra.py) makes of an elementwise op one of whose operands is a
    running aggregate (a sum, a max, a softmax sum rescaled); NONE: refused there."""

    NONE = enum.auto()
    CONVERT = enum.auto()  # the identity between float types of one range; else refused
    NEGATE = enum.auto()  # a linear op on a sum: the sum of the negated terms
    ADD = enum.auto()  # merges two sums of one term
    MAXIMUM = enum.auto()  # merges two maxima, or a max and its start value
    SUBTRACT = enum.auto()  # scores minus their running max, or a max's rescaling
    EXP = enum.auto()  # exp of such a difference: softmax weights, or a rescaling factor
    IS_FINITE = enum.auto()  # the guard of a running max
    SELECT = enum.auto()  # a guarded max, weight or rescaling
    SCALE = enum.auto()  # multiply, divide: a sum rescaled, or scaled by its home tokens' data
    LOG = enum.auto()  # log of a softmax sum: a log-sum-exp (logsum.py)
    LOG1P = enum.auto()  # log(1 + x): the softplus inside logaddexp
    ABS = enum.auto()  # |x|: of a difference of log-sum-exps, max(x, -x)
    LOGISTIC = enum.auto()  # sigmoid: of a difference of log-sum-exps, a merge weight
    MINIMUM = enum.auto()  # min of two log-sum-exps
    COMPARE = enum.auto()  # isnan / isneginf of a log-sum-exp: the guard of a merge's start


@dataclass(frozen=True, slots=True)
class OpInfo:
    """The facts about one op. `transfer`: the analysis rule (None: refused in a ring region); `motion`: where
    hoisting moves a sequence dim; `regions`; `single_result`: always exactly one result; `index`: folded as index
    arithmetic when every operand is an index; `carries_nan`: passes an unguarded exp(x - m) on to the op that
    guards it (a move, or a region or callee whose ops are judged in turn); `unit`: a predicate of whole units
    (comparisons and logic on the extreme positions of a chunk); `order_free`: as a reduction's body, its result
    doesn't depend on the order of the elements; `algebra`: see Algebra; `fold`: its arithmetic on constants;
    `verb`: what a POSITIONAL op does along the data, for its refusal; `hoist_reads`: the attributes its hoisting
    rules read (besides its operand and result types, and a reduction's body), None for all of them: hoisting
    asks the rules once per kind of op, ops alike in these being one kind."""

    transfer: Transfer | None
    motion: Motion = Motion.NONE
    regions: Regions = Regions.NONE
    single_result: bool = True
    index: bool = False
    carries_nan: bool = False
    unit: bool = False
    order_free: bool = False
    algebra: Algebra = Algebra.NONE
    fold: Callable | None = None
    verb: str | None = None
    hoist_reads: tuple[str, ...] | None = ()


# The attributes each motion's rules read (rules.py's `moves`, `carriers`, `reduced_with`; calls.py's callee).
_HOIST_READS: Mapping[Motion, tuple[str, ...]] = MappingProxyType({
    Motion.BROADCAST: ("broadcast_dimensions",), Motion.TRANSPOSE: ("permutation",), Motion.REDUCE: ("dimensions",),
    Motion.DOT: ("dot_dimension_numbers",), Motion.WHOLE_DIM: ("start_indices", "limit_indices", "strides"),
    Motion.CONCATENATE: ("dimension",), Motion.GATHER: ("dimension_numbers", "indices_are_sorted"),
    Motion.SCATTER: ("scatter_dimension_numbers", "indices_are_sorted"), Motion.CALL: ("callee",)})


def _entries() -> dict[str, OpInfo]:
    ops: dict[str, OpInfo] = {}

    def put(name: str, transfer: Transfer | None, **facts) -> None:
        assert name not in ops, name
        facts.setdefault("hoist_reads", _HOIST_READS.get(facts.get("motion", Motion.NONE), ()))
        ops[name] = OpInfo(transfer, **facts)

    # Elementwise ops. StableHLO's verifier holds them to one shape for operands and results (up to dynamic dims),
    # but for select and clamp, whose predicate or bounds may be scalars.
    ew = Transfer.ELEMENTWISE
    index = frozenset("add subtract multiply negate divide remainder compare select and or not xor maximum minimum "
                      "convert sign".split())
    unit = frozenset("compare and or not xor convert select".split())
    order_free = frozenset("add maximum minimum multiply and or".split())
    algebra = {"convert": Algebra.CONVERT, "negate": Algebra.NEGATE, "add": Algebra.ADD,
               "maximum": Algebra.MAXIMUM, "subtract": Algebra.SUBTRACT, "exponential": Algebra.EXP,
               "is_finite": Algebra.IS_FINITE, "select": Algebra.SELECT, "multiply": Algebra.SCALE,
               "divide": Algebra.SCALE, "log": Algebra.LOG, "abs": Algebra.ABS, "log_plus_one": Algebra.LOG1P,
               "logistic": Algebra.LOGISTIC, "minimum": Algebra.MINIMUM, "compare": Algebra.COMPARE}
    fold: dict[str, Callable] = {
        "add": lambda a, b: a + b, "subtract": lambda a, b: a - b, "multiply": lambda a, b: a * b,
        "divide": lambda a, b: a / b if b else None, "maximum": max, "minimum": min, "negate": lambda a: -a,
        "sqrt": math.sqrt, "rsqrt": lambda a: 1 / math.sqrt(a)}
    for short in ("abs add and atan2 cbrt ceil clamp compare complex convert cosine divide exponential "
                  "exponential_minus_one floor imag is_finite log log_plus_one logistic maximum minimum multiply "
                  "negate not or popcnt power real remainder round_nearest_afz round_nearest_even rsqrt select "
                  "shift_left shift_right_arithmetic shift_right_logical sign sine sqrt subtract tan tanh xor").split():
        put(f"stablehlo.{short}", ew,
            motion=Motion.ELEMENTWISE if short in ("select", "clamp") else Motion.SAME_SHAPE,
            index=short in index, carries_nan=short == "convert", unit=short in unit,
            order_free=short in order_free, algebra=algebra.get(short, Algebra.NONE), fold=fold.get(short))
    # Reinterpreting each element's bits (random numbers: uint32 bits made float32): elementwise where the widths
    # agree; where they differ, a dim of the widths' ratio is added or removed, which the analysis refuses.
    put("stablehlo.bitcast_convert", ew)
    for short in ("erf", "erf_inv", "lgamma", "digamma", "tan"):
        put(f"chlo.{short}", ew, motion=Motion.SAME_SHAPE)

    # Sources of index arithmetic and constants.
    put("stablehlo.constant", Transfer.CONSTANT, motion=Motion.SOURCE)
    put("stablehlo.iota", Transfer.IOTA, motion=Motion.SOURCE)
    put("stablehlo.partition_id", Transfer.PARTITION_ID)

    # Shape ops.
    put("stablehlo.broadcast_in_dim", Transfer.BROADCAST, motion=Motion.BROADCAST, carries_nan=True)
    put("stablehlo.transpose", Transfer.TRANSPOSE, motion=Motion.TRANSPOSE, carries_nan=True)
    put("stablehlo.reshape", Transfer.RESHAPE, motion=Motion.RESHAPE, carries_nan=True)
    put("stablehlo.slice", Transfer.SLICE, motion=Motion.WHOLE_DIM)
    put("stablehlo.dynamic_slice", Transfer.DYNAMIC_SLICE)
    put("stablehlo.dynamic_update_slice", Transfer.DYNAMIC_UPDATE_SLICE)
    put("stablehlo.concatenate", Transfer.CONCATENATE, motion=Motion.CONCATENATE)
    put("stablehlo.gather", Transfer.GATHER, motion=Motion.GATHER)

    # Reductions and contractions.
    put("stablehlo.reduce", Transfer.REDUCE, motion=Motion.REDUCE, regions=Regions.NESTED, single_result=False)
    put("stablehlo.dot_general", Transfer.DOT, motion=Motion.DOT)

    # Ops that keep values as they are.
    for name in ("sdy.sharding_constraint", "sdy.reshard"):
        put(name, Transfer.IDENTITY, motion=Motion.WHERE_IT_LIVES, carries_nan=True)
    put("stablehlo.optimization_barrier", Transfer.IDENTITY, carries_nan=True, single_result=False)
    put("stablehlo.reduce_precision", Transfer.IDENTITY)
    put("stablehlo.custom_call", Transfer.CUSTOM_CALL, single_result=False)

    # Collectives, control flow, calls.
    put("stablehlo.collective_permute", Transfer.COLLECTIVE_PERMUTE)
    put("stablehlo.all_reduce", Transfer.ALL_REDUCE, regions=Regions.NESTED, single_result=False)
    put("stablehlo.reduce_scatter", Transfer.OTHER_COLLECTIVE, regions=Regions.NESTED)
    for name in ("stablehlo.all_gather", "stablehlo.all_to_all"):
        put(name, Transfer.OTHER_COLLECTIVE, regions=Regions.NESTED, single_result=False)
    put("stablehlo.collective_broadcast", Transfer.OTHER_COLLECTIVE, regions=Regions.NESTED)
    put("stablehlo.while", Transfer.WHILE, carries_nan=True, regions=Regions.NESTED, single_result=False)
    for name in ("stablehlo.case", "stablehlo.if"):
        put(name, Transfer.BRANCHES, carries_nan=True, regions=Regions.NESTED, single_result=False)
    put("sdy.manual_computation", Transfer.NESTED_MANUAL, motion=Motion.AS_IS, regions=Regions.ISOLATED,
        single_result=False)
    put("func.call", Transfer.CALL, motion=Motion.CALL, carries_nan=True, single_result=False)
    put("func.return", None, motion=Motion.AS_IS, single_result=False)

    # Ops that only make sense on values that don't follow tokens: accepted there, refused on token data.
    positional = {"reverse": "reverses", "pad": "pads", "sort": "sorts", "reduce_window": "slides a window",
                  "convolution": "convolves", "fft": "transforms (FFT)", "scatter": "scatters by index",
                  "select_and_scatter": "scatters by window", "rng": "draws random numbers",
                  "rng_bit_generator": "draws random numbers", "cumsum": "accumulates along a dim",
                  "replica_id": "reads the replica index", "get_tuple_element": "unpacks a tuple",
                  "tuple": "builds a tuple"}
    motions = {"pad": Motion.WHOLE_DIM, "scatter": Motion.SCATTER}
    nested = {"sort", "reduce_window", "scatter", "select_and_scatter"}
    for short, verb in positional.items():
        reads = {"pad": ("edge_padding_low", "edge_padding_high", "interior_padding")}.get(short)
        put(f"stablehlo.{short}", Transfer.POSITIONAL, verb=verb, motion=motions.get(short, Motion.NONE),
            **({"hoist_reads": reads} if reads else {}),
            regions=Regions.NESTED if short in nested else Regions.NONE,
            single_result=short not in ("sort", "reduce_window", "scatter", "rng_bit_generator"))
    return ops


OPS: Mapping[str, OpInfo] = MappingProxyType(_entries())

# What an op without an entry is taken to be: nothing known, its regions looked at.
UNKNOWN = OpInfo(None, regions=Regions.NESTED, single_result=False, hoist_reads=None)


def info(name: str) -> OpInfo:
    return OPS.get(name, UNKNOWN)


def names(where: Callable[[OpInfo], bool]) -> frozenset[str]:
    """The ops whose entries satisfy `where`."""
    return frozenset(name for name, entry in OPS.items() if where(entry))

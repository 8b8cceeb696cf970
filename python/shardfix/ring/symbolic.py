"""Integer index arithmetic of a ring region, kept symbolic.

A ring kernel computes positions from the ring coordinate (`axis_index`, which lowers to partition_id -> divide ->
remainder), loop counters and iotas. Each integer value is an affine form over atoms:

    Var(name)     a loop counter, a stacked-buffer index, or a loop-carried integer being solved for
    Dim(d)        the index along dim d of the tensor the form describes (iota)
    Coord(hop)    the ring coordinate of the block `hop` ring steps behind this device (hop 0: its own block)
    Pid, PidDiv   partition_id, and partition_id divided by a constant (on the way to a coordinate)
    Other(axis)   the coordinate along another mesh axis (the same whatever the sequence layout)
    Node(op, ..)  anything that is not affine (comparisons, selects, truncated remainders, ...)

Ranges of atoms come from a `Scope` (loop trip counts, tensor shapes, the ring size), so comparisons and selects
whose outcome the ranges decide fold away (jnp's negative-index normalisation, its floor-mod fix-up). The forms and
that folding share one normal form, so they stay in one module.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Mapping, Union

# ---------------------------------------------------------------------------------------------------------------
# Atoms.


@dataclass(frozen=True)
class Var:
    name: str

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class Dim:
    index: int

    def __str__(self) -> str:
        return f"i{self.index}"


@dataclass(frozen=True)
class Coord:
    hop: "Aff"  # affine over Vars only

    def __str__(self) -> str:
        return "c" if self.hop.is_zero else f"c[{self.hop}]"


@dataclass(frozen=True)
class Pid:
    def __str__(self) -> str:
        return "pid"


@dataclass(frozen=True)
class PidDiv:
    stride: int

    def __str__(self) -> str:
        return f"(pid/{self.stride})"


@dataclass(frozen=True)
class Other:
    """The coordinate along a mesh axis other than the ring's."""

    axis: str

    def __str__(self) -> str:
        return f"axis({self.axis})"


@dataclass(frozen=True)
class Node:
    """A non-affine value: op is one of the names below, args are Affs (or ints for constants). `src` remembers the
    op that built the node and which of its operands each argument came from, so that a coordinate-based position
    read by a comparison can be rewritten where it is read. It is part of the node's identity: the same comparison
    computed by two ops is two values of the program, of which the rewrite changes only those read (a where between
    two copies of one mask is not one of them, whatever the copies compute)."""

    op: str  # lt le gt ge eq ne and or not xor select trem div max min fmod opaque gpos
    args: tuple
    # (op, operand of each arg, the func.call ops the op was reached through)
    src: tuple | None = None

    def __str__(self) -> str:
        return f"{self.op}({', '.join(map(str, self.args))})"


Atom = Union[Var, Dim, Coord, Pid, PidDiv, Other, Node]
_opaque_ids = itertools.count()


# ---------------------------------------------------------------------------------------------------------------
# Affine forms.


@dataclass(frozen=True)
class Aff:
    terms: tuple[tuple[Atom, int], ...] = ()  # sorted by str(atom), no zero coefficients
    const: int = 0

    @staticmethod
    def of(value: "int | Atom | Aff") -> "Aff":
        if isinstance(value, Aff):
            return value
        if isinstance(value, int):
            return Aff((), value)
        return Aff(((value, 1),), 0)

    @staticmethod
    def _make(coeffs: Mapping, const: int) -> "Aff":
        return Aff(tuple(sorted(((a, c) for a, c in coeffs.items() if c), key=lambda t: _atom_key(t[0]))), const)

    @property
    def is_const(self) -> bool:
        return not self.terms

    @property
    def is_zero(self) -> bool:
        return not self.terms and self.const == 0

    def coeffs(self) -> dict:
        return dict(self.terms)

    def atoms(self) -> list:
        return [a for a, _ in self.terms]

    def __add__(self, other) -> "Aff":
        other = Aff.of(other)
        if not other.terms:
            return self if not other.const else Aff(self.terms, self.const + other.const)
        if not self.terms:
            return other if not self.const else Aff(other.terms, self.const + other.const)
        coeffs = self.coeffs()
        for atom, c in other.terms:
            coeffs[atom] = coeffs.get(atom, 0) + c
        return Aff._make(coeffs, self.const + other.const)

    __radd__ = __add__

    def __neg__(self) -> "Aff":
        return Aff(tuple((a, -c) for a, c in self.terms), -self.const)

    def __sub__(self, other) -> "Aff":
        return self + (-Aff.of(other))

    def __rsub__(self, other) -> "Aff":
        return Aff.of(other) - self

    def scale(self, k: int) -> "Aff":
        if k == 0:
            return Aff()
        return Aff(tuple((a, c * k) for a, c in self.terms), self.const * k)

    def coefficient(self, atom) -> int:
        for a, c in self.terms:
            if a == atom:
                return c
        return 0

    def without(self, atom) -> "Aff":
        return Aff(tuple(t for t in self.terms if t[0] != atom), self.const)

    def substitute(self, mapping: Mapping) -> "Aff":
        """Replace atoms (keys) by forms; the replacement recurses into Coord hops and Node arguments."""
        if not self.terms or not mapping:
            return self
        out = Aff((), self.const)
        for atom, c in self.terms:
            out = out + _substitute_atom(atom, mapping).scale(c)
        return out

    def free_atoms(self) -> set:
        """Every atom, including those inside Coord hops and Node arguments."""
        found = set()
        for atom, _ in self.terms:
            found.add(atom)
            if isinstance(atom, Coord):
                found |= atom.hop.free_atoms()
            elif isinstance(atom, Node):
                for arg in atom.args:
                    if isinstance(arg, Aff):
                        found |= arg.free_atoms()
        return found

    def __str__(self) -> str:
        parts = []
        for atom, c in self.terms:
            parts.append(f"{atom}" if c == 1 else f"-{atom}" if c == -1 else f"{c}*{atom}")
        if self.const or not parts:
            parts.append(str(self.const))
        return " + ".join(parts).replace("+ -", "- ")


def _atom_key(atom) -> str:
    if isinstance(atom, Node) and atom.src is not None:  # one order for copies of one node made by other ops
        return f"Node:{atom}@{hash(atom.src):x}"
    return f"{type(atom).__name__}:{atom}"


def _substitute_atom(atom, mapping: Mapping) -> Aff:
    if atom in mapping:
        return Aff.of(mapping[atom])
    if isinstance(atom, Coord):
        return Aff.of(Coord(atom.hop.substitute(mapping)))
    if isinstance(atom, Node):
        args = tuple(a.substitute(mapping) if isinstance(a, Aff) else a for a in atom.args)
        return simplify_node(Node(atom.op, args, atom.src), None)
    return Aff.of(atom)


def opaque() -> Aff:
    """A value the analysis knows nothing about."""
    return Aff.of(Node("opaque", (next(_opaque_ids),)))


def is_opaque(value: Aff) -> bool:
    return any(isinstance(a, Node) and a.op == "opaque" for a in value.free_atoms())


# ---------------------------------------------------------------------------------------------------------------
# Ranges.


@dataclass
class Scope:
    """What bounds the atoms: the ring size, loop variables' ranges (bounds may be affine in outer variables),
    the extents of the dims of the tensor a form describes, and the mesh's axes (name, size): a device's index
    along another axis, or its partition index, is below that axis's size, or the number of devices."""

    cp: int
    var_bounds: dict  # Var -> (lo: Aff, hi: Aff), inclusive
    dim_sizes: tuple[int, ...] = ()
    mesh_axes: tuple[tuple[str, int], ...] = ()

    def with_dims(self, sizes) -> "Scope":
        return Scope(self.cp, self.var_bounds, tuple(sizes), self.mesh_axes)

    def with_vars(self, var_bounds: dict, dim_sizes: tuple[int, ...] | None = None) -> "Scope":
        return Scope(self.cp, var_bounds, self.dim_sizes if dim_sizes is None else dim_sizes, self.mesh_axes)


def bounds(value: Aff, scope: Scope | None) -> tuple[float, float]:
    """An inclusive interval holding every value of the form (infinite where unbounded)."""
    if value.is_const:
        return value.const, value.const
    if scope is None:
        return -math.inf, math.inf
    return _end(value, scope, lower=True, depth=0), _end(value, scope, lower=False, depth=0)


def _end(value: Aff, scope: Scope, lower: bool, depth: int) -> float:
    """One end of the interval. A loop variable whose bounds depend on other variables is replaced by the bound
    that pushes this end furthest, before anything is treated as independent: `k - j` with j in [0, k-1] is then
    at least 1, not at least -(k-1)."""
    if depth < 8:
        for atom, c in value.terms:
            if isinstance(atom, Var) and atom in scope.var_bounds:
                lo, hi = scope.var_bounds[atom]
                if not (lo.is_const and hi.is_const):
                    bound = lo if (c > 0) == lower else hi
                    return _end(value.substitute({atom: bound}), scope, lower, depth + 1)
    total = value.const
    for atom, c in value.terms:
        a_lo, a_hi = _atom_bounds(atom, scope)
        if c > 0:
            total += c * (a_lo if lower else a_hi)
        else:
            total += c * (a_hi if lower else a_lo)
    return total


def _atom_bounds(atom, scope: Scope) -> tuple[float, float]:
    if isinstance(atom, Var):
        if atom in scope.var_bounds:
            lo, hi = scope.var_bounds[atom]
            return bounds(lo, scope)[0], bounds(hi, scope)[1]
        return -math.inf, math.inf
    if isinstance(atom, Dim):
        if atom.index < len(scope.dim_sizes):
            return 0, scope.dim_sizes[atom.index] - 1
        return -math.inf, math.inf
    if isinstance(atom, Coord):
        return 0, scope.cp - 1
    if isinstance(atom, Other):  # an axis the scope doesn't know is unbounded: no type is taken to hold it
        sizes = dict(scope.mesh_axes)
        return 0, (sizes[atom.axis] - 1 if atom.axis in sizes else math.inf)
    if isinstance(atom, (Pid, PidDiv)):
        if not scope.mesh_axes:
            return 0, math.inf
        last = math.prod(size for _, size in scope.mesh_axes) - 1
        return 0, (last if isinstance(atom, Pid) else last // atom.stride)
    if isinstance(atom, Node):
        return _node_bounds(atom, scope)
    return -math.inf, math.inf


def _node_bounds(node: Node, scope: Scope) -> tuple[float, float]:
    op, args = node.op, node.args
    if op in _COMPARISONS or op in ("and", "or", "not", "xor"):
        return 0, 1
    if op == "select":
        a, b = bounds(args[1], scope), bounds(args[2], scope)
        return min(a[0], b[0]), max(a[1], b[1])
    if op in ("max", "min"):
        a, b = bounds(args[0], scope), bounds(args[1], scope)
        return (max(a[0], b[0]), max(a[1], b[1])) if op == "max" else (min(a[0], b[0]), min(a[1], b[1]))
    if op == "sign":
        return -1, 1
    if op == "gpos":  # a unit's place in the new order: one of the cp * a units (a: units a block, the coordinate's)
        a = [c for atom, c in args[0].terms if isinstance(atom, Coord)]
        return (0, scope.cp * a[0] - 1) if len(a) == 1 and a[0] > 0 else (-math.inf, math.inf)
    if op in ("trem", "fmod"):
        x, d = bounds(args[0], scope), args[1]
        if op == "fmod" or x[0] >= 0:
            return 0, d - 1
        return -(d - 1), d - 1
    if op == "div":
        x, d = bounds(args[0], scope), args[1]
        return math.floor(x[0] / d) if x[0] != -math.inf else -math.inf, math.floor(x[1] / d) \
            if x[1] != math.inf else math.inf
    return -math.inf, math.inf


def congruent(a: Aff, b: Aff, n: int, scope: Scope | None) -> bool:
    """Whether a = b (mod n) for every value of the atoms (integers): every coefficient of a - b and its constant
    are multiples of n (`-3j` and `j` modulo 4), or the ranges leave a - b one value, a multiple of n (the
    iteration variable of a loop that runs once)."""
    diff = a - b
    if diff.const % n == 0 and all(c % n == 0 for _, c in diff.terms):
        return True
    lo, hi = bounds(diff, scope)
    return lo == hi and math.isfinite(lo) and lo % n == 0


def differs_mod(a: Aff, b: Aff, n: int, scope: Scope) -> bool:
    """Whether a != b (mod n) for every value of the atoms (integers), as far as ranges and divisibility show:
    `2j` and `2j' + 1` never meet modulo 4 (the even and odd ring steps of a loop that runs two an iteration),
    because every value of `2j - 2j' - 1` is odd and 4 is even."""
    diff = a - b
    lo, hi = bounds(diff, scope)
    if (0 < lo and hi < n) or (-n < lo and hi < 0):
        return True
    # sum(c_i x_i) + c0 = 0 (mod n) has integer solutions only if gcd(c_1, ..., c_m, n) divides c0
    return diff.const % math.gcd(n, *(c for _, c in diff.terms)) != 0


# ---------------------------------------------------------------------------------------------------------------
# Non-affine operations, folded where the ranges decide them.

_COMPARISONS = {"lt": lambda x, y: x < y, "le": lambda x, y: x <= y, "gt": lambda x, y: x > y,
                "ge": lambda x, y: x >= y, "eq": lambda x, y: x == y, "ne": lambda x, y: x != y}


def compare(op: str, a: Aff, b: Aff, scope: Scope | None, src=None) -> Aff:
    return simplify_node(Node(op, (a, b), src), scope)


def select(cond: Aff, a: Aff, b: Aff, scope: Scope | None, src=None) -> Aff:
    return simplify_node(Node("select", (cond, a, b), src), scope)


def logical(op: str, *args: Aff, scope: Scope | None = None) -> Aff:
    return simplify_node(Node(op, tuple(args)), scope)


def divide(a: Aff, d: int, scope: Scope | None, src=None) -> Aff:
    """Truncated division by a positive constant (`src`: the op, as for comparisons, so that a position it
    divides can be rewritten where it is read)."""
    if a == Aff.of(Pid()):
        return Aff.of(PidDiv(d))
    if d == 1:
        return a
    if all(c % d == 0 for _, c in a.terms) and a.const % d == 0:
        return Aff(tuple((x, c // d) for x, c in a.terms), a.const // d)
    lo, hi = bounds(a, scope)
    if lo >= 0 and hi < d:
        return Aff()
    return Aff.of(Node("div", (a, d), src))


def remainder(a: Aff, d: int, scope: Scope | None, coord_of=None, src=None) -> Aff:
    """Truncated remainder by a positive constant (stablehlo.remainder); `coord_of(stride, size)` names the ring
    coordinate or another axis for `(partition_id / stride) % size`."""
    if d == 1:
        return Aff()
    if a == Aff.of(Pid()):
        a = Aff.of(PidDiv(1))
    if len(a.terms) == 1 and a.const == 0 and isinstance(a.terms[0][0], PidDiv) and a.terms[0][1] == 1 \
            and coord_of is not None:
        found = coord_of(a.terms[0][0].stride, d)
        if found is not None:
            return found
    lo, hi = bounds(a, scope)
    if lo >= 0:
        return floor_mod(a, d, scope, src)
    return Aff.of(Node("trem", (a, d), src))


def floor_mod(a: Aff, d: int, scope: Scope | None, src=None) -> Aff:
    """Python's `a % d` for a positive constant d: a ring coordinate shifted by whole hops stays a coordinate."""
    # x % m differs from x by a multiple of m, so modulo a divisor d of m it is x: `((me - i) % (2 * cp)) % cp`
    nested = [(atom, c) for atom, c in a.terms if isinstance(atom, Node) and atom.op == "fmod"
              and isinstance(atom.args[1], int) and atom.args[1] % d == 0]
    for atom, c in nested:
        a = a.without(atom) + Aff.of(atom.args[0]).scale(c)
    coords = [(atom, c) for atom, c in a.terms if isinstance(atom, Coord)]
    if scope is not None and d == scope.cp and len(coords) == 1 and coords[0][1] % d == 1 % d:
        (coord, _), = coords
        rest = a.without(coord)
        # (c_h + r) mod cp = c_{h - r}, and r counts modulo cp: `(src + cp - 1) % cp` is `(src - 1) % cp`, the block
        # one ring step further behind (each coefficient of r taken to its residue nearest zero, and a term that is a
        # multiple of cp dropped whatever integer it multiplies: `cp * axis_index("dp")`); r may vary along a dim,
        # `(me - jnp.arange(cp)) % cp` being row by row the coordinate of the block that many steps behind
        shift = Aff(tuple((x, _residue(c, d)) for x, c in rest.terms if c % d), _residue(rest.const, d))
        if all(isinstance(x, (Var, Dim)) for x in shift.atoms()):
            return Aff.of(Coord(coord.hop - shift))
    reduced = Aff(tuple((x, c % d) for x, c in a.terms if c % d), a.const % d)
    lo, hi = bounds(reduced, scope)
    if 0 <= lo and hi < d:
        return reduced
    return Aff.of(Node("fmod", (reduced, d), src))


def _residue(x: int, n: int) -> int:
    """x modulo n, in [-n/2, n/2)."""
    return (x + n // 2) % n - n // 2


def sign(a: Aff, scope: Scope | None, src=None) -> Aff:
    """stablehlo.sign of an integer; for a value known not to be negative (a position), `a != 0`."""
    lo, hi = bounds(a, scope)
    if lo > 0 or hi < 0:
        return Aff.of(1 if lo > 0 else -1)
    if lo == hi == 0:
        return Aff()
    if lo >= 0:
        return compare("ne", a, Aff(), scope, src and (src[0], (src[1][0], src[1][0]), src[2]))
    return Aff.of(Node("sign", (a,), src))


def maximum(a: Aff, b: Aff, scope: Scope | None, src=None) -> Aff:
    return simplify_node(Node("max", (a, b), src), scope)


def minimum(a: Aff, b: Aff, scope: Scope | None, src=None) -> Aff:
    return simplify_node(Node("min", (a, b), src), scope)


def _truth(value: Aff, scope: Scope | None) -> bool | None:
    lo, hi = bounds(value, scope)
    if lo == hi == 0:
        return False
    if lo >= 1:
        return True
    return None


def simplify_node(node: Node, scope: Scope | None) -> Aff:
    op, args = node.op, node.args
    if op in _COMPARISONS:
        a, b = args
        if op in ("eq", "ne") and _is_bool(a, scope) and b.is_const and b.const in (0, 1):
            # comparing a predicate with a constant: the predicate itself or its negation
            return a if (op == "ne") == (b.const == 0) else logical("not", a, scope=scope)
        if op in ("eq", "ne") and _is_bool(a, scope) and _is_bool(b, scope):
            unequal = logical("xor", a, b, scope=scope)
            return unequal if op == "ne" else logical("not", unequal, scope=scope)
        lo, hi = bounds(a - b, scope)
        decided = {"lt": (hi < 0, lo >= 0), "le": (hi <= 0, lo > 0), "gt": (lo > 0, hi <= 0),
                   "ge": (lo >= 0, hi < 0), "eq": (lo == hi == 0, lo > 0 or hi < 0),
                   "ne": (lo > 0 or hi < 0, lo == hi == 0)}[op]
        if decided[0]:
            return Aff.of(1)
        if decided[1]:
            return Aff()
        return Aff.of(Node(op, (a, b), node.src))
    if op == "select":
        cond, a, b = args
        truth = _truth(cond, scope)
        if truth is not None:
            return a if truth else b
        if a == b:
            return a
        fixed = _floor_mod_fixup(cond, a, b, scope)
        if fixed is None:
            fixed = _wrap_fixup(cond, a, b, scope)
        if fixed is None:
            fixed = _floor_div_fixup(cond, a, b, scope)
        if fixed is not None:
            return fixed
        return Aff.of(Node("select", (cond, a, b), node.src))
    if op in ("and", "or", "xor"):
        truths = [_truth(x, scope) for x in args]
        if op == "and":
            if False in truths:
                return Aff()
            rest = [x for x, t in zip(args, truths) if t is None]
            return Aff.of(1) if not rest else rest[0] if len(rest) == 1 else _and_implied(rest, scope)
        if op == "or":
            if True in truths:
                return Aff.of(1)
            rest = [x for x, t in zip(args, truths) if t is None]
            return Aff() if not rest else rest[0] if len(rest) == 1 else Aff.of(Node("or", tuple(rest)))
        if None not in truths:
            return Aff.of(int(truths[0] != truths[1]))
        known = [t for t in truths if t is not None]
        if known:  # x xor False = x; x xor True = not x
            unknown = args[truths.index(None)]
            return unknown if not known[0] else logical("not", unknown, scope=scope)
        return Aff.of(Node("xor", tuple(args)))
    if op == "not":
        truth = _truth(args[0], scope)
        if truth is not None:
            return Aff.of(int(not truth))
        inner = args[0]
        if len(inner.terms) == 1 and inner.const == 0 and isinstance(inner.terms[0][0], Node) \
                and inner.terms[0][0].op in _COMPARISONS:
            cmp = inner.terms[0][0]
            flipped = {"lt": "ge", "le": "gt", "gt": "le", "ge": "lt", "eq": "ne", "ne": "eq"}[cmp.op]
            return Aff.of(Node(flipped, cmp.args, cmp.src))
        return Aff.of(Node("not", (inner,)))
    if op in ("max", "min"):
        a, b = args
        lo, hi = bounds(a - b, scope)
        if (op == "max" and lo >= 0) or (op == "min" and hi <= 0):
            return a
        if (op == "max" and hi <= 0) or (op == "min" and lo >= 0):
            return b
        return Aff.of(Node(op, (a, b), node.src))
    if op == "trem":
        return remainder(args[0], args[1], scope, src=node.src)
    if op == "fmod":
        return floor_mod(args[0], args[1], scope, node.src)
    if op == "div":
        return divide(args[0], args[1], scope, node.src)
    if op == "sign":
        return sign(args[0], scope, node.src)
    return Aff.of(node)


def _and_implied(args: list, scope) -> Aff:
    """`x < 0 and x != 0` is `x < 0`: drop conjuncts another one implies (jnp's floor-mod fix-up has this form)."""
    kept = list(args)
    for x in args:
        for y in args:
            if x is not y and _implies(y, x) and x in kept and y in kept and not _reads_coordinates(x):
                kept.remove(x)
                break
    return kept[0] if len(kept) == 1 else Aff.of(Node("and", tuple(kept)))


def _reads_coordinates(value: Aff) -> bool:
    """Whether `value` is a comparison whose op reads ring coordinates itself: the rewrite changes that op's
    operands, so dropping it (as implied by another) would leave it in the old layout in the program."""
    cmp = _as_cmp(value)
    return cmp is not None and any(isinstance(arg, Aff) and any(isinstance(a, (Coord, Pid, PidDiv))
                                                                 for a in arg.atoms()) for arg in cmp.args)


def _as_cmp(value: Aff):
    if len(value.terms) == 1 and value.const == 0 and value.terms[0][1] == 1 and isinstance(value.terms[0][0], Node) \
            and value.terms[0][0].op in _COMPARISONS:
        return value.terms[0][0]
    return None


def _implies(y: Aff, x: Aff) -> bool:
    """Whether comparison y implies comparison x, for the forms jnp emits (r < 0 implies r != 0)."""
    cy, cx = _as_cmp(y), _as_cmp(x)
    if cy is None or cx is None or cy.args != cx.args:
        return False
    strong = {"lt": {"ne", "le"}, "gt": {"ne", "ge"}, "eq": {"le", "ge"}}
    return cx.op in strong.get(cy.op, set())


def _floor_mod_fixup(cond: Aff, a: Aff, b: Aff, scope) -> Aff | None:
    """jnp's floor mod: r = trem(x, d); select(r < 0 (for d > 0), r + d, r) is x mod d."""
    cmp = _as_cmp(cond)
    if cmp is None or cmp.op != "lt" or cmp.args[1] != Aff():
        return None
    r = cmp.args[0]
    if b != r or len(r.terms) != 1 or r.const != 0 or r.terms[0][1] != 1:
        return None
    node = r.terms[0][0]
    if not isinstance(node, Node) or node.op != "trem" or a != r + node.args[1]:
        return None
    return floor_mod(node.args[0], node.args[1], scope, node.src)


def _wrap_fixup(cond: Aff, a: Aff, b: Aff, scope) -> Aff | None:
    """A value wrapped by hand, `where(x < 0, x + d, x)` (or `where(x >= 0, x, x + d)`) for x in [-d, d): x mod d
    (a ring source written `where(me - i < 0, me - i + cp, me - i)` is the coordinate `(me - i) % cp`)."""
    cmp = _as_cmp(cond)
    if cmp is None:
        return None
    lhs, rhs = cmp.args
    if rhs.is_zero and cmp.op in ("lt", "ge"):
        x, negative_picks_a = lhs, cmp.op == "lt"
    elif lhs.is_zero and cmp.op in ("gt", "le"):  # 0 > x is x < 0; 0 <= x is x >= 0
        x, negative_picks_a = rhs, cmp.op == "gt"
    else:
        return None
    wrapped, kept = (a, b) if negative_picks_a else (b, a)
    d = wrapped - x
    if kept != x or not d.is_const or d.const <= 0:
        return None
    lo, hi = bounds(x, scope)
    if lo < -d.const or hi >= d.const:
        return None
    return floor_mod(x, d.const, scope)


def _floor_div_fixup(cond: Aff, a: Aff, b: Aff, scope) -> Aff | None:
    """jnp's floor division of x >= 0 by d > 0: q = x / d (truncated); select(sign(x) != sign(d) and x rem d != 0,
    q - 1, q) is q, because for x >= 0 the signs differ only where x == 0, whose remainder is 0. The condition is
    checked to be exactly that (as the folding above leaves it: `x == 0 and x rem d != 0`)."""
    if len(b.terms) != 1 or b.const or b.terms[0][1] != 1 or a != b - 1:
        return None
    q = b.terms[0][0]
    if not isinstance(q, Node) or q.op != "div" or bounds(q.args[0], scope)[0] < 0:
        return None
    x, d = q.args
    conj = cond.terms[0][0] if len(cond.terms) == 1 and not cond.const and cond.terms[0][1] == 1 else None
    if not isinstance(conj, Node) or conj.op != "and" or len(conj.args) != 2:
        return None
    # compared as values, whichever ops computed them: for x >= 0 the condition is false in any layout, so the ops
    # it drops may read the old layout's positions
    expected = {compare("eq", x, Aff(), scope), compare("ne", remainder(x, d, scope), Aff(), scope)}
    return b if {_unsourced(arg) for arg in conj.args} == {_unsourced(e) for e in expected} else None


def _unsourced(expr: Aff) -> Aff:
    return map_sources(expr, lambda _: None)


def gpos(value: Aff, unit: int) -> Aff:
    """The global index (in units of `unit` tokens) the rewritten program computes in place of `value`."""
    return Aff.of(Node("gpos", (value, unit)))


def _is_bool(value: Aff, scope) -> bool:
    if value.is_const:
        return value.const in (0, 1)
    if len(value.terms) == 1 and value.const == 0 and value.terms[0][1] == 1 and isinstance(value.terms[0][0], Node):
        return value.terms[0][0].op in _COMPARISONS or value.terms[0][0].op in ("and", "or", "not", "xor")
    return False
def sourced_nodes(expr: Aff):
    """The nodes in `expr` (at any depth) that remember the op that built them."""
    for atom, _ in expr.terms:
        if isinstance(atom, Node):
            if atom.src is not None:
                yield atom
            for arg in atom.args:
                if isinstance(arg, Aff):
                    yield from sourced_nodes(arg)


def map_sources(expr: Aff, fn) -> Aff:
    """`expr` with each node's `src` replaced by fn(src)."""
    if next(sourced_nodes(expr), None) is None:
        return expr

    def atom_map(atom):
        if not isinstance(atom, Node):
            return atom
        args = tuple(map_sources(a, fn) if isinstance(a, Aff) else a for a in atom.args)
        return Node(atom.op, args, None if atom.src is None else fn(atom.src))

    return Aff(tuple((atom_map(a), c) for a, c in expr.terms), expr.const)



"""Records of what the passes did (Fix, Remark, RingDecision), diagnostics, the warning and error users see, and
their text and JSON renderings. Pure: imports neither MLIR nor JAX."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace

from .locations import SourceLoc


class ShardingFixWarning(UserWarning):
    """shardfix changed a sharding (the message says where, why, and from what to what)."""


class ShardingFixError(ValueError):
    """Raised with `on_fix="error"` when shardfix would have changed a sharding."""


@dataclass(frozen=True)
class Diagnostic:
    severity: str  # "error" | "warning" | "remark" | "note"
    message: str
    loc: SourceLoc = SourceLoc()

    def render(self, fallback: str = "") -> str:
        where = str(self.loc) if self.loc.file else fallback
        return f"{where}: {self.severity}: {self.message}" if where else f"{self.severity}: {self.message}"


@dataclass(frozen=True)
class Fix:
    """One sharding change; `count` > 1 when the same change was made at several sites of one line (an argument
    and a result, forward and backward, several layers), the other sites in `more_sites`."""

    pass_name: str
    site: str
    loc: SourceLoc
    reasons: tuple[tuple[str, str], ...]  # (code, detail)
    before: str
    after: str
    shards_before: int
    shards_after: int
    count: int = 1
    more_sites: tuple[str, ...] = ()
    shape: tuple | None = None  # the value's, where known: fixes of values of other shapes are not merged
    bytes_before: int | None = None  # the value's bytes on each device with the sharding before, and after
    bytes_after: int | None = None

    @property
    def location(self) -> str:
        return str(self.loc)

    @property
    def reason(self) -> str:
        """The reason codes, comma separated (most fixes have one)."""
        return ",".join(dict.fromkeys(code for code, _ in self.reasons))

    @property
    def sites(self) -> tuple[str, ...]:
        return (self.site,) + self.more_sites

    def message(self) -> str:
        details = "; ".join(f"{code}: {detail}" for code, detail in self.reasons)
        return f"{self.site}: {self.before} -> {self.after} ({details})"

    def to_json(self) -> dict:
        data = {"kind": "fix", "pass": self.pass_name, "site": self.site, "location": self.location,
                "reason": self.reason, "details": [d for _, d in self.reasons], "before": self.before,
                "after": self.after, "shards_before": self.shards_before, "shards_after": self.shards_after}
        if self.count > 1:
            data.update(count=self.count, sites=list(self.sites))
        if self.bytes_before is not None:
            data.update(bytes_per_device_before=self.bytes_before, bytes_per_device_after=self.bytes_after)
        return data

    @property
    def memory(self) -> str:
        """What the fix does to each device's memory for the value, in words ('' where not known)."""
        if self.bytes_before is None or self.bytes_after is None:
            return ""
        before, after = self.bytes_before, self.bytes_after
        change = f" (x{after / before:.2f})" if before and before != after else ""
        return f"per device: {before:,} -> {after:,} bytes{change}"


def bytes_per_device(shape, shards_per_dim, itemsize: int) -> int:
    """The bytes one device holds of an array of `shape` split `shards_per_dim` ways on each dim (a padded split
    holds whole rows of padding)."""
    count = itemsize
    for n, k in zip(shape, shards_per_dim):
        count *= -(-n // max(k, 1))
    return count


def merge_fixes(fixes) -> list[Fix]:
    """One Fix per (location, reason, before, after, shape), in order of first appearance, with the count of the
    fixes it stands for and their distinct sites (values of other shapes, wq's 6 heads and wk's 2, stay apart)."""
    merged: dict[tuple, Fix] = {}
    for fix in fixes:
        key = (fix.location, fix.reason, fix.before, fix.after, fix.shape)
        first = merged.get(key)
        if first is None:
            merged[key] = fix
            continue
        sites = tuple(dict.fromkeys(first.sites + fix.sites))
        reasons = tuple(dict.fromkeys(first.reasons + fix.reasons))
        merged[key] = replace(first, reasons=reasons, count=first.count + fix.count, more_sites=sites[1:])
    return list(merged.values())


def render_fixes(fixes, name: str) -> str:
    """The text of the warning (or error, or log line) that tells a user what changed in `name`."""
    total = sum(f.count for f in fixes)
    lines = [f"shardfix changed {total} sharding(s) of {name}:"]
    for f in fixes:
        site = f.site if len(f.sites) == 1 else f"{f.site} and {len(f.sites) - 1} more site(s)"
        times = f" (x{f.count})" if f.count > 1 else ""
        lines.append(f"  {f.location or '?'}: {site}: {f.before} -> {f.after} [{f.reason}]{times}")
        lines += [f"      {detail}" for detail in dict.fromkeys(detail for _, detail in f.reasons)]
        if f.memory:
            lines.append(f"      {f.memory}")
    return "\n".join(lines)


@dataclass(frozen=True)
class Remark:
    """Something a pass wants the user to know without having changed anything (a rewrite it refused, say)."""

    pass_name: str
    message: str
    loc: SourceLoc = SourceLoc()

    @property
    def location(self) -> str:
        return str(self.loc)

    def to_json(self) -> dict:
        return {"kind": "remark", "pass": self.pass_name, "location": self.location, "message": self.message}


@dataclass(frozen=True)
class RingDecision:
    """What ring-reorder decided for one ring region."""

    axis: str
    strategy: str
    applied: bool
    why: str
    loc: SourceLoc = SourceLoc()
    # The tiles (skipped-or-computed blocks of the kernel's skip conditionals) counted at compile time, where they
    # were: the sum over ring steps of the busiest device's tiles as written (contiguous) and in the layout applied
    # (as written when left alone), the total spread evenly over the devices, and what the count rests on.
    critical_before: int | None = None
    critical_after: int | None = None
    ideal: float | None = None
    basis: str = ""

    @property
    def location(self) -> str:
        return str(self.loc)

    def to_json(self) -> dict:
        data = asdict(self)
        del data["loc"]
        return {"kind": "ring", **data, "location": self.location}


@dataclass
class Report:
    fixes: list[Fix] = field(default_factory=list)
    remarks: list[Remark] = field(default_factory=list)
    rings: list[RingDecision] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.fixes or self.remarks or self.rings)

    def extend(self, other: "Report") -> None:
        self.fixes += other.fixes
        self.remarks += other.remarks
        self.rings += other.rings

    def diagnostics(self) -> list[Diagnostic]:
        """Every record as a remark, for --verify-diagnostics."""
        out = [Diagnostic("remark", f"{f.pass_name}: {f.message()}", f.loc) for f in self.fixes]
        out += [Diagnostic("remark", f"{r.pass_name}: {r.message}", r.loc) for r in self.remarks]
        out += [Diagnostic("remark", "ring-reorder: " + _ring_text(r), r.loc) for r in self.rings]
        return out

    def render_json(self) -> str:
        records = [r.to_json() for r in (*self.fixes, *self.remarks, *self.rings)]
        return "".join(json.dumps(r, sort_keys=True) + "\n" for r in records)

    def render_text(self) -> str:
        lines = []
        if self.fixes:
            rows = [("location", "site", "reason", "before", "after", "shards")]
            rows += [(f.location or "?", f.site, f.reason, f.before, f.after, f"{f.shards_before}->{f.shards_after}")
                     for f in self.fixes]
            widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
            lines.append(f"{len(self.fixes)} sharding fix(es):")
            for row in rows:
                lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[-1])
            for f in self.fixes:
                for code, detail in f.reasons:
                    lines.append(f"  - {f.location or '?'}: {code}: {detail}")
        for r in self.rings:
            lines.append(f"ring: {r.location or '?'}: {_ring_text(r)}")
        for r in self.remarks:
            lines.append(f"remark: {r.location or '?'}: {r.pass_name}: {r.message}")
        return "\n".join(lines) + ("\n" if lines else "")


def _ring_text(r: RingDecision) -> str:
    state = "applied" if r.applied else "not applied"
    tiles = "" if r.critical_before is None else (
        f"; tiles on the critical path {r.critical_before} -> {r.critical_after}, ideal {r.ideal:g} ({r.basis})")
    return f"axis \"{r.axis}\", {r.strategy}: {state}" + (f" ({r.why}{tiles})" if r.why or tiles else "")

"""One writer of request state: a request's status, num_computed, map_limit, planned start
(plan_pos, plan_pending, plan_open, plan_drafts), rows this step (sched_n) and drafts
(has_drafts, and the partition's draft and confidence tables) change only in the
Partition's named transitions (engine/partition.py); Request.__init__ sets their first
values. Everyone else decides and asks.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SHIPPED = ("dspark_loop", "workers", "tools", "dspark_testing")
OWNED = {
    "status",
    "num_computed",
    "map_limit",
    "plan_pos",
    "plan_pending",
    "plan_open",
    "plan_drafts",
    "sched_n",
    "has_drafts",
}
TABLES = {"drafts", "conf"}  # Partition.drafts / .conf [leases, K]: written as x.drafts[...] = ...
OWNER = "dspark_loop/engine/partition.py"
REQUEST = "dspark_loop/engine/request.py"


def _targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        return node.targets
    if isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        return [node.target]
    return []


def _flatten(target: ast.expr) -> list[ast.expr]:
    if isinstance(target, (ast.Tuple, ast.List)):
        return [t for e in target.elts for t in _flatten(e)]
    if isinstance(target, ast.Starred):
        return _flatten(target.value)
    return [target]


def writes_of_owned_fields(source: str, rel: str) -> list[str]:
    """'rel:line obj.field' for each write of an owned field the rule forbids in `rel`.
    `self.<field> =` counts only inside the engine (elsewhere self is no Request: an HTTP
    error's status), and is allowed in request.py (the constructor)."""
    if rel == OWNER:
        return []
    in_engine = rel.startswith("dspark_loop/engine/")
    bad = []
    for node in ast.walk(ast.parse(source)):
        written = [t for target in _targets(node) for t in _flatten(target)]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr":
            if len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and node.args[1].value in OWNED:
                bad.append(f"{rel}:{node.lineno} setattr(..., {node.args[1].value!r})")
        for t in written:
            table = isinstance(t, ast.Subscript) and isinstance(t.value, ast.Attribute) and t.value.attr in TABLES
            if table and in_engine:
                bad.append(f"{rel}:{t.lineno} {ast.unparse(t)}")
                continue
            if not (isinstance(t, ast.Attribute) and t.attr in OWNED):
                continue
            on_self = isinstance(t.value, ast.Name) and t.value.id == "self"
            if on_self and (not in_engine or rel == REQUEST):
                continue
            bad.append(f"{rel}:{t.lineno} {ast.unparse(t)}")
    return bad


def test_only_the_partition_writes_request_status_positions_plans_rows_and_drafts():
    """Request.status, num_computed, map_limit, plan_*, sched_n, has_drafts and the draft
    tables must be written only by the Partition's transitions (and the Request
    constructor), nowhere else in shipped code."""
    bad = []
    for package in SHIPPED:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            bad += writes_of_owned_fields(path.read_text(encoding="utf-8"), rel)
    assert bad == []


def test_the_scan_finds_every_form_of_write():
    """The scan must catch plain, augmented, annotated, unpacking, setattr and draft-table
    writes, and must let a non-engine class keep its own `self.status`."""
    src = (
        "req.status = 1\n"
        "req.num_computed += 3\n"
        "a.map_limit: int = 0\n"
        "x, r.status = 1, 2\n"
        "setattr(req, 'num_computed', 0)\n"
        "self.status = 2\n"
        "req.sched_n = 4\n"
        "part.drafts[leases] = d\n"
        "req.plan_pos, req.plan_pending = 0, False\n"
        "req.lease = 3\n"
    )
    engine = writes_of_owned_fields(src, "dspark_loop/engine/step_apply.py")
    assert sorted(int(line.split(":")[1].split(" ")[0]) for line in engine) == [1, 2, 3, 4, 5, 6, 7, 8, 9, 9]
    assert len(writes_of_owned_fields(src, "dspark_loop/api/errors.py")) == 8
    assert writes_of_owned_fields(src, OWNER) == []

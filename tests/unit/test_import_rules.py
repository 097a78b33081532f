"""The package boundaries, as a rule the suite enforces (docs/architecture.md, "The map").

workers/            -> dspark_loop.contract only (the facts both sides agree on)
dspark_loop/contract -> nothing else of ours; no torch, aiohttp, zmq
dspark_loop/engine   -> dspark_loop.engine, dspark_loop.contract; no torch, aiohttp, zmq
dspark_loop/checkpoint -> itself, dspark_loop.contract; no torch, aiohttp, zmq (the server builds
                        the default model with it)
dspark_loop/ (server) -> never torch at module level (the server process stays torch-free)
the product          -> never tools/, dspark_testing/ or tests/, not even lazily inside a function
                        (dspark_loop/ and workers/: what a deployment runs; test doubles are
                        handed in or named by config, as RankConfig.runner)
dspark_testing/      -> never tests/ (it is installed; tests/ is not)
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("dspark_loop", "workers")
NOT_PRODUCT = ("tools", "dspark_testing", "tests")


def imports_of(path: Path, module_level_only: bool = False) -> list[tuple[int, str]]:
    """(line, module) for every import in a file; `from . import x` never occurs (absolute imports)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = tree.body if module_level_only else ast.walk(tree)
    found = []
    for node in nodes:
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.append((node.lineno, node.module))
    return found


def violations(folder: str, allowed, module_level_only: bool = False) -> list[str]:
    bad = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        for line, module in imports_of(path, module_level_only):
            if not allowed(module):
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    return bad


def top(module: str) -> str:
    return module.split(".")[0]


def within(module: str, *packages: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


OURS = ("dspark_loop", "workers", "tools", "dspark_testing", "tests")
HEAVY = ("torch", "aiohttp", "zmq")


def test_workers_import_only_the_contract_from_the_server_package():
    """A rank process must depend on the server package only through dspark_loop.contract."""
    assert violations("workers", lambda m: top(m) != "dspark_loop" or within(m, "dspark_loop.contract")) == []


def test_the_contract_depends_on_nothing_else_of_ours_and_no_heavy_library():
    """dspark_loop.contract is imported by both sides, so it must stay a leaf: no torch, aiohttp or zmq."""

    def allowed(m: str) -> bool:
        if top(m) in HEAVY:
            return False
        return top(m) not in OURS or within(m, "dspark_loop.contract")

    # NOTE: mesh_join is the peers' half of the handshake and needs zmq's socket constants.
    bad = [
        v for v in violations("dspark_loop/contract", allowed) if not v.startswith("dspark_loop/contract/mesh_join.py")
    ]
    assert bad == []


def test_the_engine_imports_neither_torch_nor_aiohttp_nor_zmq():
    """The engine is pure scheduling over numpy: only itself, the contract and light libraries."""

    def allowed(m: str) -> bool:
        if top(m) in HEAVY:
            return False
        return top(m) not in OURS or within(m, "dspark_loop.engine", "dspark_loop.contract")

    assert violations("dspark_loop/engine", allowed) == []


def test_the_checkpoint_writer_imports_only_itself_and_the_contract_and_no_heavy_library():
    """dspark_loop.checkpoint runs in the server process (the default model) and in tools."""

    def allowed(m: str) -> bool:
        if top(m) in HEAVY:
            return False
        return top(m) not in OURS or within(m, "dspark_loop.checkpoint", "dspark_loop.contract")

    assert violations("dspark_loop/checkpoint", allowed) == []


def test_the_server_process_never_imports_torch_at_module_level():
    """The server process reads config.json and tokenizer.json itself; all tensors live in the ranks."""
    assert violations("dspark_loop", lambda m: top(m) != "torch", module_level_only=True) == []


@pytest.mark.parametrize("package", PRODUCT)
def test_the_product_imports_neither_tools_nor_test_doubles_nor_tests(package):
    """dspark_loop/ and workers/ run in a deployment: nothing of tools/, dspark_testing/ or
    tests/ (module level or inside a function), so neither needs to ship with them."""
    assert violations(package, lambda m: top(m) not in NOT_PRODUCT) == []


def test_the_installed_test_doubles_never_import_the_tests():
    """dspark_testing/ is installed (rank processes load its runners by name); tests/ is not."""
    assert violations("dspark_testing", lambda m: top(m) != "tests") == []


def test_the_rule_catches_a_violation(tmp_path):
    """The checker itself must see a forbidden import (so an empty list above means something)."""
    bad = tmp_path / "pkg"
    bad.mkdir()
    (bad / "mod.py").write_text("import os\n\ndef f():\n    from torch import nn\n")
    found = [m for _, m in imports_of(bad / "mod.py")]
    assert found == ["os", "torch"]
    assert [m for _, m in imports_of(bad / "mod.py", module_level_only=True)] == ["os"]

"""`python -m tools.bench`: the benchmarks and what each measures (each module's first line)."""

from __future__ import annotations

import ast
from pathlib import Path

HERE = Path(__file__).parent


def benchmarks() -> dict[str, str]:
    """name -> its docstring's first sentence, for every module here with a main()."""
    out = {}
    for path in sorted(HERE.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body) and path.stem != "__main__":
            first = " ".join((ast.get_docstring(tree) or "").split("\n\n")[0].split())
            out[path.stem] = first.split(": ")[0].split(". ")[0].rstrip(".")
    return out


def main() -> None:
    for name, line in benchmarks().items():
        print(f"python -m tools.bench.{name:<9} {line}")
    print("\n--help on each for its options; docs/benchmarks.md for what the figures mean.")


if __name__ == "__main__":
    main()

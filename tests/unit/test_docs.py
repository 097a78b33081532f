"""README.md and docs/ are a user's pages: every repository path they name exists, they cite
nothing outside the repository, and the README stays short."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 150  # a user's page, not a notebook

# Folders a page may name a path relative to (`engine/loop.py`, `chat/validate.py`); a page's
# own folder is added per page (`deployment.md` from docs/).
BASES = ("", "dspark_loop", "dspark_loop/api", "workers", "tools", "tests")
PACKAGES = ("dspark_loop", "workers", "tools", "dspark_testing", "tests")  # `python -m tools.tap`
EXTENSIONS = (".py", ".md", ".sh", ".json")
# Files of a checkpoint or a run directory, named without a folder: they are not the repository's.
NOT_OURS = {
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "model.safetensors.index.json",
    "convert_release.json",
    "manifest.json",
    "spec.json",
}
OUTSIDE = re.compile(r"DESIGN\.md|dspark\.md|taken at commit|\.\./shared")  # files a user does not have
SEPARATORS = re.compile(r"[`'\"()\[\],;|]|\]\(")


def words_of(text: str) -> list[str]:
    """Every whitespace-separated word of a page, without quotes, brackets or trailing punctuation."""
    return [w.rstrip(".:!?") for w in SEPARATORS.sub(" ", text).split()]


def _basenames() -> set[str]:
    return {p.name for p in ROOT.rglob("*") if ".venv" not in p.parts and ".git" not in p.parts}


def _exists(rel: str, bases: tuple[str, ...]) -> bool:
    return any((ROOT / base / rel).exists() for base in bases)


def _defines(module: Path, name: str) -> bool:
    """The module defines `name` at its top level (a def, a class or an assignment)."""
    pattern = rf"^(?:async def|def|class) {name}\b|^{name}\s*[:=]"
    return re.search(pattern, module.read_text("utf-8"), re.M) is not None


def module_exists(dotted: str) -> bool:
    """`tools.make_checkpoint` as tools/make_checkpoint.py or tools/make_checkpoint/; a trailing
    attribute (`...default_model.ensure_default_model`) must be defined in the module."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:n])
        found = base.with_suffix(".py") if base.with_suffix(".py").is_file() else None
        if found is None and (base / "__init__.py").is_file():
            found = base / "__init__.py"
        if found is None and base.is_dir() and n == len(parts):
            return True
        if found is not None:
            rest = parts[n:]
            return len(rest) <= 1 and (not rest or _defines(found, rest[0]))
    return False


def claimed_paths(text: str, folder: str) -> list[str]:
    """The repository paths a page's text names that do not exist (relative to the repo root,
    a source folder or the page's own folder; modules by their dotted name)."""
    bases = (*BASES, folder)
    names = _basenames()
    missing = []
    for word in words_of(text):
        word = word.split("#")[0]
        if not word or word.startswith(("/", "~", "$", ".", "-")) or "://" in word or "*" in word:
            continue
        if re.fullmatch(r"[\w.]+", word) and word.split(".")[0] in PACKAGES and "." in word:
            if not module_exists(word):
                missing.append(word)
        elif "/" in word:
            first = word.split("/")[0]
            if first.isupper():  # a placeholder folder: DIR/model, OUT/convert_release.json
                continue
            claims = word.endswith(EXTENSIONS) or any((ROOT / base / first).is_dir() for base in bases)
            if claims and not re.search(r"[<>{}=]", word) and not _exists(word, bases):
                missing.append(word)
        elif word.endswith(EXTENSIONS) and re.fullmatch(r"[\w.-]+", word):
            if word not in NOT_OURS and word not in names:
                missing.append(word)
    return missing


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_repository_path_a_page_names_exists(page):
    """A path, link or `python -m` module named in README.md or docs/ must be in the repository."""
    assert claimed_paths(page.read_text(encoding="utf-8"), str(page.parent.relative_to(ROOT))) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_page_cites_a_file_outside_the_repository(page):
    """The pages never point at notes a user of the repository does not have."""
    lines = page.read_text(encoding="utf-8").splitlines()
    assert [f"{i}: {line}" for i, line in enumerate(lines, 1) if OUTSIDE.search(line)] == []


def test_the_readme_is_under_150_lines():
    """README.md is a user's first page; run-by-run detail lives in docs/."""
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) < README_MAX_LINES


def test_the_path_check_catches_a_missing_file_and_module():
    """The checker must see a stale path, a stale module and a stale bare file name, and only them."""
    probe = (
        "See `api/completion_choices.py` and `engine/loop.py`; run `python -m tools.no_such_tool` or\n"
        "`python -m tools.tap`, `tools.tap.no_such_name`, read [the map](architecture.md) and DESIGN.md;\n"
        "`/v1/completions`, `dspark_loop.config.default_model.ensure_default_model`,\n"
        "`config.json`, /tmp/tiny, DIR/model and on/off are not repository paths.\n"
    )
    assert claimed_paths(probe, "docs") == [
        "api/completion_choices.py",
        "tools.no_such_tool",
        "tools.tap.no_such_name",
        "DESIGN.md",
    ]

"""The documentation holds to what it promises a reader.

- The generated references (configuration, CLI, metrics) are what the code makes now.
- The README is one screen of orientation: at most 200 lines.
- Nothing in the repository tells its own history (that is ``CHANGELOG.md``'s and the commit messages' job),
  and nothing cites a file outside the repository.
- Every path the repository's text names exists, so a moved or deleted script or result cannot leave a
  dangling pointer in a docstring or a page.
- Known limits is a short list, each entry naming the test or the result that shows it.
- ``benchmarks/results/`` holds only current results the docs link, under the names of what they measure.
"""

from __future__ import annotations

import re
import subprocess
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOP_FOLDERS = [
    "benchmarks",
    "cli",
    "client",
    "common",
    "control_plane",
    "decode_worker",
    "docker",
    "docs",
    "engine",
    "frontdoor",
    "helm",
    "length_predictor",
    "observability",
    "operations",
    "prefill_worker",
    "protos",
    "scripts",
    "sdk",
    "tests",
    "transport",
    "worker",
]
TEXT_SUFFIXES = {
    ".py",
    ".pyi",
    ".md",
    ".txt",
    ".toml",
    ".yaml",
    ".yml",
    ".json",
    ".sh",
    ".proto",
    ".tpl",
    ".cfg",
    ".ini",
    ".Dockerfile",
    "",
    ".j2",
    ".csv",
}


@cache
def _repository_files() -> tuple[Path, ...]:
    """Tracked files and untracked ones git does not ignore: what a submission holds."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    return tuple(ROOT / p for p in out.split("\0") if p and (ROOT / p).is_file() and not (ROOT / p).is_symlink())


def _text_files(*, skip: tuple[str, ...] = ()) -> list[tuple[Path, str]]:
    found = []
    for path in _repository_files():
        rel = path.relative_to(ROOT).as_posix()
        if rel in skip or path.suffix not in TEXT_SUFFIXES or "_pb2" in path.name:
            continue
        try:
            found.append((path, path.read_text()))
        except UnicodeDecodeError:
            continue
    return found


def _hits(pattern: re.Pattern[str], files: list[tuple[Path, str]]) -> list[str]:
    return [
        f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)!r}"
        for path, text in files
        for m in pattern.finditer(text)
    ]


def test_the_generated_references_are_what_the_code_makes() -> None:
    from scripts.docs_reference import stale_pages

    assert stale_pages() == [], "run `python scripts/docs_reference.py` and commit docs/reference/"


def test_the_readme_fits_on_one_screen_of_orientation() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines: its detail belongs in docs/"


# Built from parts, so that this file does not match itself.
_SESSION = "sess" + r"ions?\s*\d+"
_ISSUE = "iss" + r"ues?\s*#\s*\d+"
HISTORY = re.compile(rf"\b(?:{_SESSION}|{_ISSUE})", re.IGNORECASE)
OUTSIDE = re.compile(
    "|".join(
        [
            r"\bDESIGN" + r"\.md\b",  # the team's map outside the repository
            r"\.\./" + "shared",
            r"\bshared/" + r"(?:seeds|kuberay|hooks)",
            r"\.lib" + r"rary/",
        ]
    )
)


def test_nothing_tells_how_the_code_got_here_outside_the_changelog() -> None:
    hits = _hits(HISTORY, _text_files(skip=("CHANGELOG.md",)))
    assert not hits, "history belongs in CHANGELOG.md and commit messages:\n" + "\n".join(hits[:40])


def test_nothing_cites_a_file_outside_the_repository() -> None:
    hits = _hits(OUTSIDE, _text_files())
    assert not hits, "\n".join(hits[:40])


PATH = re.compile(
    rf"(?<![\w./-])((?:{'|'.join(TOP_FOLDERS)})/[\w./-]*?\."
    r"(?:py|md|json|png|yaml|yml|sh|proto|txt|csv|tpl|toml|Dockerfile))(?![\w*{<-]|\.\w)"
)
PLACEHOLDERS = {"tests/unit/test_x.py"}  # a made-up selection the test script's own tests pass along


# The folders the repository ignores at its root (``/benchmarks/_work/`` in ``.gitignore``): a file there exists
# only where a benchmark ran, never in a clean checkout.
SCRATCH = [
    line.strip().strip("/")
    for line in (ROOT / ".gitignore").read_text().splitlines()
    if line.startswith("/") and line.strip().endswith("/")
]


def _scratch(path: Path) -> bool:
    rel = path.resolve().relative_to(ROOT).as_posix() if path.resolve().is_relative_to(ROOT) else ""
    return any(rel == d or rel.startswith(d + "/") for d in SCRATCH)


def _resolves(named: str, source: Path) -> bool:
    """A path names a file of a clean checkout from the repository's root, or (in the docs and their nav) from
    ``docs/``."""
    bases = [ROOT]
    if source.name == "mkdocs.yml" or "docs" in source.relative_to(ROOT).parts[:1]:
        bases += [ROOT / "docs", source.parent]
    return named in PLACEHOLDERS or any((base / named).exists() and not _scratch(base / named) for base in bases)


def test_every_path_the_text_names_exists() -> None:
    missing = []
    for path, text in _text_files(skip=("CHANGELOG.md",)):
        for m in PATH.finditer(text):
            if not _resolves(m.group(1), path):
                line = text.count("\n", 0, m.start()) + 1
                missing.append(f"{path.relative_to(ROOT)}:{line}: {m.group(1)}")
    assert not missing, "names a file that does not exist:\n" + "\n".join(missing[:60])


def _known_limits() -> list[str]:
    text = (ROOT / "docs" / "known-limits.md").read_text()
    return re.findall(r"^- \*\*.*?(?=^- \*\*|^#|\Z)", text, flags=re.MULTILINE | re.DOTALL)


def test_known_limits_is_a_short_list_with_evidence_for_each_entry() -> None:
    entries = _known_limits()
    assert 0 < len(entries) <= 40, f"{len(entries)} entries"
    evidence = re.compile(r"tests/\S+\.py|benchmarks/results/\S+\.md|benchmarks/\S+\.py")
    without = [e.splitlines()[0] for e in entries if not evidence.search(e)]
    assert not without, "entries naming no test or result:\n" + "\n".join(without)


RESULTS = ROOT / "benchmarks" / "results"
DIARY_NAMES = re.compile(r"(^s\d+_|_s\d+(_|\.|$)|before|after|probe|_ab(_|\.|$)|final)", re.IGNORECASE)


def _docs_text() -> str:
    return "\n".join(p.read_text() for p in (ROOT / "docs").rglob("*.md") if "results" not in p.parts)


def test_results_are_named_for_what_they_measure() -> None:
    bad = [p.name for p in RESULTS.iterdir() if DIARY_NAMES.search(p.stem)]
    assert not bad, f"results named for when or how they were made: {bad}"


@pytest.mark.parametrize("suffix", [".md", ".png"])
def test_the_docs_link_every_result(suffix: str) -> None:
    docs = _docs_text()
    unlinked = [p.name for p in sorted(RESULTS.glob(f"*{suffix}")) if f"results/{p.name}" not in docs]
    assert not unlinked, f"results no page links: {unlinked}"


def test_every_raw_result_belongs_to_a_report() -> None:
    reports = [p.stem for p in RESULTS.glob("*.md")]
    orphans = [p.name for p in RESULTS.iterdir() if p.suffix not in (".md", ".png")
               and not any(p.stem.startswith(stem) for stem in reports)]
    assert not orphans, f"raw results without their report: {orphans}"

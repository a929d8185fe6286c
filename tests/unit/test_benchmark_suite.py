"""The benchmark suite's registry and runner (``benchmarks/suite.py``), without running a benchmark."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import suite
from benchmarks.suite import REGISTRY, Entry

RESULTS = Path(suite.__file__).resolve().parent / "results"


def test_every_entry_runs_a_script_that_exists() -> None:
    for e in REGISTRY:
        assert e.script.is_file(), f"{e.name}: {e.command[0]} does not exist"
        assert e.script.parent.name == "benchmarks", f"{e.name}: a suite script lives in benchmarks/, not below"


def test_entry_names_are_unique_and_name_their_results() -> None:
    names = [e.name for e in REGISTRY]
    assert len(names) == len(set(names))
    for e in REGISTRY:
        assert e.results, e.name
        assert all(r.startswith(e.name) for r in e.results), f"{e.name}: results must be named <name>.* or <name>_*"
        assert f"{e.name}.md" in e.results, f"{e.name}: every entry writes <name>.md"


def test_every_entry_has_its_current_result_unless_it_needs_a_gpu() -> None:
    for e in REGISTRY:
        if not e.gpu:
            assert (RESULTS / f"{e.name}.md").is_file(), f"{e.name}: no current result {e.name}.md"


def test_results_hold_only_suite_results() -> None:
    claimed = {r for e in REGISTRY for r in e.results}
    stray = sorted(p.name for p in RESULTS.iterdir() if p.name not in claimed)
    assert not stray, f"files in benchmarks/results/ no suite entry writes: {stray}"


def test_dry_run_prints_every_command_and_runs_nothing(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def never(e: Entry) -> int:
        raise AssertionError(f"--dry-run ran {e.name}")

    monkeypatch.setattr(suite, "subprocess_runner", never)
    fake = (Entry("a", ("fake_a", "--x", "1"), "A", 2, ("a.md",)),)
    assert suite.main(["--dry-run"], registry=fake) == 0
    out = capsys.readouterr().out
    assert "python fake_a --x 1" in out and "[1/1] a (about 2 min)" in out
    assert suite.main(["--dry-run"]) == 0
    out = capsys.readouterr().out
    assert all(e.shell() in out for e in REGISTRY)


def test_list_names_every_entry(capsys: pytest.CaptureFixture[str]) -> None:
    assert suite.main(["--list"]) == 0
    out = capsys.readouterr().out
    for e in REGISTRY:
        assert f"| {e.name} |" in out and e.shell() in out


def test_only_and_skip_select_in_registry_order() -> None:
    fake = [Entry(n, (f"fake_{n}",), n, 1, (f"{n}.md",)) for n in ("a", "b", "c")]
    assert [e.name for e in suite.select(fake, ["c", "a"], [])] == ["a", "c"]
    assert [e.name for e in suite.select(fake, [], ["b"])] == ["a", "c"]
    with pytest.raises(SystemExit, match="no such suite entry: x"):
        suite.select(fake, ["x"], [])


def test_a_failing_entry_is_reported_and_the_rest_run(tmp_path: Path) -> None:
    fake = [
        Entry("a", ("fake_a",), "A", 1, ("a.md", "a.json")),
        Entry("b", ("fake_b",), "B", 1, ("b.md",)),
        Entry("g", ("fake_g",), "G", 1, ("g.md",), gpu=True),
        Entry("c", ("fake_c",), "C", 1, ("c.md",)),
    ]
    ran: list[str] = []

    def runner(e: Entry) -> int:
        ran.append(e.name)
        if e.name == "b":
            return 3
        if e.name == "c":
            raise FileNotFoundError("no python")
        (tmp_path / "a.md").write_text("# a\n")
        return 0

    lines: list[str] = []
    outcomes = suite.run(fake, runner, gpu_available=lambda: False, results=tmp_path, out=lines.append)
    assert ran == ["a", "b", "c"]
    assert [(o.entry.name, o.status) for o in outcomes] == [
        ("a", "ok"),
        ("b", "failed"),
        ("g", "skipped"),
        ("c", "failed"),
    ]
    assert outcomes[0].written == ["a.md"]
    assert outcomes[1].detail == "exit status 3"
    assert any(line.startswith("[2/4] b (about 1 min) ...") for line in lines)
    table = suite.summary(outcomes)
    assert "| a | ok |" in table and "a.md" in table and "| b | failed (exit status 3) |" in table
    assert "1 ok, 2 failed, 1 skipped" in table


def test_main_exit_status_says_whether_any_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = (Entry("a", ("fake_a",), "A", 1, ("a.md",)), Entry("b", ("fake_b",), "B", 1, ("b.md",)))
    monkeypatch.setattr(suite, "subprocess_runner", lambda e: 0)
    assert suite.main([], registry=fake) == 0
    monkeypatch.setattr(suite, "subprocess_runner", lambda e: 1 if e.name == "a" else 0)
    assert suite.main([], registry=fake) == 1

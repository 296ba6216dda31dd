"""torchwatch.analysis.rules_engine: rule files, their errors (file + line), templates, loading."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from torchwatch.analysis.rules_engine import Rule, builtin_dir, fill, load_dir, load_rules, parse_rule
from torchwatch.model.errors import RuleError, UsageError
from torchwatch.model.units import human_bytes

FUZZ = settings(max_examples=300, deadline=2000, database=None, derandomize=True)
PATH = "rules/test-rule.toml"

# Line numbers matter: tests below replace whole lines by number.
VALID = """\
id = "test-rule"
label = "io-bound"
severity = "warning"
summary = "Storage waits take {storage_wait_share:.0%} of the loop."
when = "storage_wait_share >= 0.2"
measure = "storage_wait_share"
for = 2.0
evidence = ["storage_wait_share", "worker_count"]
source = "a test"

[[fixes]]
title = "Use workers"
detail = "num_workers={worker_count:.0f}: try {suggested_workers}."
when = "worker_count < suggested_workers"

[[fixes]]
title = "Cache the data"
detail = "Reads at {read_bytes_per_s:.3g} bytes/s."
"""


def with_line(n: int, text: str) -> str:
    """VALID with line ``n`` (1-based) replaced by ``text``."""
    lines = VALID.splitlines()
    lines[n - 1] = text
    return "\n".join(lines) + "\n"


def rule_error(text: str, path: str = PATH) -> RuleError:
    with pytest.raises(RuleError) as exc:
        parse_rule(text, path)
    err = exc.value
    assert err.path == path
    assert path in err.one_line()
    assert len(err.one_line().splitlines()) == 1
    return err


def test_parse_valid_rule() -> None:
    r = parse_rule(VALID, PATH)
    assert (r.id, r.label, r.severity, r.hold_s, r.path) == (
        "test-rule",
        "io-bound",
        "warning",
        2.0,
        PATH,
    )
    assert r.inputs == frozenset({"storage_wait_share"})
    assert r.measure is not None and r.measure.evaluate({"storage_wait_share": 0.3}) == 0.3
    assert r.evidence == ("storage_wait_share", "worker_count")
    assert [f.title for f in r.fixes] == ["Use workers", "Cache the data"]
    assert r.fixes[0].when is not None and r.fixes[1].when is None
    assert r.when.evaluate({"storage_wait_share": 0.25}) is True


def test_optional_keys_default() -> None:
    text = "\n".join(
        ln for ln in VALID.split("[[fixes]]")[0].splitlines() if not ln.startswith(("for", "measure", "evidence"))
    )
    r = parse_rule(text, PATH)
    assert (r.hold_s, r.measure, r.evidence, r.fixes) == (0.0, None, (), ())


@pytest.mark.parametrize(
    ("line", "text", "problem"),
    [
        (3, 'severity = "warning', "invalid TOML"),
        (10, 'colour = "red"', "unknown key 'colour'"),
        (2, 'label = "slow"', "label must be one of"),
        (3, 'severity = "fatal"', "severity must be one of"),
        (5, 'when = "storage_wait_share >="', "when"),
        (5, 'when = "storage_wait_share >= nope"', "unknown feature 'nope'"),
        (5, 'when = "storage_wait_share.real > 1"', "not allowed"),
        (8, 'evidence = ["storage_wait_share", "nope"]', "unknown feature 'nope'"),
        (4, 'summary = "Storage {nope}"', "unknown field {nope}"),
        (4, 'summary = "Storage {storage_wait_share!r}"', "conversion !r not allowed"),
        (4, 'summary = "Storage {storage_wait_share:d}"', "bad format spec"),
        (4, 'summary = "Storage {storage_wait_share.real}"', "unknown field"),
        (4, 'summary = "Storage {"', "bad template"),
        (7, "for = -1", "'for' must be a number"),
        (7, "for = true", "'for' must be a number"),
        (7, "for = 4000", "'for' must be a number"),
        (7, 'for = "2"', "'for' must be a number"),
        (1, 'id = "Bad Id"', "id must be"),
        (1, "id = 3", "'id' must be a string"),
        (6, 'measure = "storage_wait_share +"', "measure"),
        (14, 'when = "worker_count < nope"', "unknown feature 'nope'"),
        (12, 'title = "Use {nope}"', "unknown field {nope}"),
        (12, 'titel = "typo"', "unknown key 'titel'"),
    ],
)
def test_malformed_rule_names_path_and_line(line: int, text: str, problem: str) -> None:
    err = rule_error(with_line(line, text))
    assert err.line == line, err.one_line()
    assert problem in err.problem
    assert f"{PATH}:{line}" in err.one_line()


def test_missing_key_has_no_line() -> None:
    err = rule_error(VALID.replace('source = "a test"\n', ""))
    assert err.line is None and "missing key 'source'" in err.problem


def test_fixes_must_be_array_of_tables() -> None:
    text = VALID.split("[[fixes]]")[0] + '[fixes]\ntitle = "x"\ndetail = "y"\n'
    assert "array of tables" in rule_error(text).problem


def test_bad_detail_template_names_detail_line() -> None:
    err = rule_error(with_line(13, 'detail = "try {nope}"'))
    assert err.line == 13


def test_id_with_trailing_newline_is_rejected() -> None:
    rule_error(with_line(1, 'id = "abc\\n"'))


def test_rule_error_one_line_is_single_line_even_for_multiline_path() -> None:
    err = RuleError("a\nb.toml", 3, "problem\nwith two lines")
    assert "\n" not in err.one_line()
    assert err.one_line().startswith("torchwatch: error: bad rule file")
    assert err.exit_code == 2


def test_fill_formats_and_marks_missing() -> None:
    text = "{storage_wait_share:.0%} of the loop, {worker_count:.0f} workers, try {suggested_workers}"
    assert (
        fill(text, {"storage_wait_share": 0.456, "worker_count": None, "suggested_workers": 3})
        == "46% of the loop, n/a workers, try 3"
    )
    assert fill("no fields", {}) == "no fields"
    assert fill("{{literal}} {usable_cpus:g}", {"usable_cpus": 2.0}) == "{literal} 2"


def test_duplicate_ids_across_files(tmp_path: Path) -> None:
    (tmp_path / "a.toml").write_text(VALID)
    (tmp_path / "b.toml").write_text("# same id\n" + VALID)
    with pytest.raises(RuleError) as exc:
        load_dir(tmp_path)
    assert exc.value.path == str(tmp_path / "b.toml")
    assert exc.value.line == 2
    assert str(tmp_path / "a.toml") in exc.value.problem


def test_load_dir_errors(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no such directory"):
        load_dir(tmp_path / "missing")
    (tmp_path / "bin.toml").write_bytes(b"\xff\xfe id")
    with pytest.raises(RuleError, match="not UTF-8"):
        load_dir(tmp_path)


def test_load_dir_ignores_other_files_and_sorts(tmp_path: Path) -> None:
    (tmp_path / "b.toml").write_text(with_line(1, 'id = "bbb"'))
    (tmp_path / "a.toml").write_text(with_line(1, 'id = "aaa"'))
    (tmp_path / "notes.txt").write_text("not a rule")
    assert [r.id for r in load_dir(tmp_path)] == ["aaa", "bbb"]


def test_shipped_rules_load() -> None:
    rules = load_rules()
    files = sorted(builtin_dir().glob("*.toml"))
    assert len(files) >= 1
    assert sorted(r.id for r in rules) == sorted(p.stem for p in files)
    for r in rules:
        assert r.source.strip(), r.id  # every threshold cites where it comes from
        assert r.fixes, r.id


def test_extra_dir_overrides_same_id(tmp_path: Path) -> None:
    builtin = {r.id: r for r in load_rules()}
    assert "storage-wait" in builtin
    (tmp_path / "mine.toml").write_text(with_line(1, 'id = "storage-wait"'))
    (tmp_path / "new.toml").write_text(with_line(1, 'id = "brand-new"'))
    merged = {r.id: r for r in load_rules([tmp_path])}
    assert len(merged) == len(builtin) + 1
    assert merged["storage-wait"].path == str(tmp_path / "mine.toml")
    assert merged["storage-wait"].label == "io-bound" and merged["storage-wait"].severity == "warning"
    assert merged["brand-new"].path == str(tmp_path / "new.toml")


def test_bad_extra_dir_raises(tmp_path: Path) -> None:
    (tmp_path / "bad.toml").write_text(with_line(2, 'label = "slow"'))
    with pytest.raises(RuleError) as exc:
        load_rules([tmp_path])
    assert exc.value.path == str(tmp_path / "bad.toml") and exc.value.line == 2


# --- fuzz ---------------------------------------------------------------------------------


def check_outcome(text: str) -> None:
    try:
        rule = parse_rule(text, PATH)
    except RuleError as err:
        assert err.path == PATH
        assert err.line is None or 1 <= err.line <= text.count("\n") + 1
        assert len(err.one_line().splitlines()) == 1
        return
    assert isinstance(rule, Rule) and rule.path == PATH


@st.composite
def mutated_rule(draw: st.DrawFn) -> str:
    text = VALID
    for _ in range(draw(st.integers(1, 3))):
        lines = text.splitlines(keepends=True)
        op = draw(st.sampled_from(["delete", "duplicate", "replace"]))
        if op == "replace" or not lines:
            if not text:
                text = draw(st.characters())
                continue
            i = draw(st.integers(0, len(text) - 1))
            text = text[:i] + draw(st.characters()) + text[i + 1 :]
            continue
        i = draw(st.integers(0, len(lines) - 1))
        if op == "delete":
            del lines[i]
        else:
            lines.insert(i, lines[i])
        text = "".join(lines)
    return text


@FUZZ
@given(st.text())
def test_fuzz_random_text(text: str) -> None:
    check_outcome(text)


@FUZZ
@given(mutated_rule())
def test_fuzz_mutated_rule_file(text: str) -> None:
    check_outcome(text)


@pytest.mark.parametrize(
    ("n", "text"),
    [(0, "0 B"), (1023, "1023 B"), (4096, "4.0 KiB"), (2 * 2**20 + 1, "2.0 MiB"), (150 * 2**30, "150 GiB")],
)
def test_human_bytes(n: float, text: str) -> None:
    assert human_bytes(n) == text


def test_bytes_spec_fills_with_binary_units_and_n_a() -> None:
    rule = parse_rule(
        'id = "b"\nlabel = "io-bound"\nseverity = "info"\nwhen = "rss_bytes > 0"\nsource = "s"\n'
        'summary = "holds {rss_bytes:bytes}, reads {read_bytes_per_s:bytes}/s"\n',
        "b.toml",
    )
    assert fill(rule.summary, {"rss_bytes": 3 * 2**30, "read_bytes_per_s": None}) == "holds 3.0 GiB, reads n/a/s"
    with pytest.raises(RuleError, match="bad format spec"):
        parse_rule(
            'id = "b"\nlabel = "io-bound"\nseverity = "info"\nwhen = "rss_bytes > 0"\nsource = "s"\n'
            'summary = "{rss_bytes:byte}"\n',
            "b.toml",
        )


def test_a_source_tree_that_was_not_installed_finds_the_shipped_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    from torchwatch.analysis import rules_engine

    def missing(name: str) -> None:
        raise ModuleNotFoundError(name)

    monkeypatch.setattr(rules_engine.resources, "files", missing)
    found = rules_engine.builtin_dir()
    assert found.name == "rules" and (found / "loop-cpu.toml").is_file(), found

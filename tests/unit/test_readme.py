"""The README is a front door whose commands do not rot, and every page of docs/ is reachable from it.

Every command in the README's code blocks (and every inline `torchwatch ...` span) is either one of
the two set-up commands at the top (the second one is what `.ci/run` runs, verbatim; the first one's
parts are checked one by one), or a torchwatch command that torchwatch's own argument parser accepts,
naming only options that exist on that sub-command (argparse would take a renamed option's old name
as an abbreviation of a longer one: `--keep` for `--keep-hook`, so each name is looked up exactly).
The README's option table is checked the same way, option by option and command by command. The
README stays at most 250 lines and 20 KB (issue 34), links every page of docs/, and every relative
link in it and in docs/ resolves to a file of the repository (and, with an anchor, to a heading).
"""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from torchwatch.cli import build_parser
from torchwatch.model.errors import UsageError

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = REPO / "docs"
CI_RUN = REPO / ".ci" / "run"

# Issue 34's acceptance: the README is a front door, not the reference.
MAX_LINES = 250
MAX_BYTES = 20_000

pytestmark = pytest.mark.skipif(not README.exists(), reason="the README is not installed with the package")

# Placeholders the README's synopsis lines use, and a value of each that the parser accepts.
PLACEHOLDERS = {
    "[HOST:]PORT": "9400",
    "SETTING=VALUE": "threads=2",
    "PID": "4242",
    "DIR": "rules",
    "PATH": "out.json",
    "N": "3",
    "SECONDS": "30",
    "LABELS": "dataloader-bound,hang",
    "STEPS": "100,1000",
}
OPTIONAL_PLACEHOLDERS = ("[OPTIONS]",)  # stands for the option table: nothing to parse
FENCED = re.compile(r"^[ \t]*```.*?^[ \t]*```", re.S | re.M)  # a fenced code block, indented or not


@dataclass(frozen=True)
class Command:
    """One command the README shows: where (``line``, 1-based), its text (prompt and comment removed),
    and whether it is an inline code span (a mention, ``torchwatch trial``, need not be complete)."""

    line: int
    text: str
    inline: bool = False


def _code_blocks(text: str) -> Iterator[tuple[str, int, list[str]]]:
    """Each fenced block of ``text``: its language, the line number of its first line, its lines."""
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        fence = re.match(r"^```(\S*)\s*$", lines[i])
        if fence is None:
            i += 1
            continue
        start = i + 1
        end = start
        while end < len(lines) and not lines[end].startswith("```"):
            end += 1
        yield fence.group(1), start + 1, lines[start:end]
        i = end + 1


def _strip_comment(line: str) -> str:
    """``line`` without a trailing shell comment (a ``#`` that starts a word)."""
    return re.split(r"(?:^|\s)#", line, maxsplit=1)[0].strip()


def readme_commands(text: str) -> list[Command]:
    """Every command in ``text``: each non-comment line of a ``bash`` block, each ``$ `` line of a
    ``console`` block, and each inline code span that starts with ``torchwatch ``.

    Raises:
        AssertionError: a code block in another language (a command there would escape the check).
    """
    found: list[Command] = []
    for lang, first, lines in _code_blocks(text):
        assert lang in ("bash", "console"), f"README line {first - 1}: a code block in {lang or 'no language'!r}"
        for offset, raw in enumerate(lines):
            if lang == "console":
                if not raw.startswith("$ "):
                    continue
                raw = raw[2:]
            line = _strip_comment(raw)
            if line:
                found.append(Command(first + offset, line))
    fenced = FENCED.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    for number, line in enumerate(fenced.split("\n"), 1):
        for span in re.findall(r"`([^`]+)`", line):
            if span.startswith("torchwatch "):
                found.append(Command(number, span, inline=True))
    return found


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The sub-command parsers of ``parser`` by name (``{}`` when it has none)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _leaf(parser: argparse.ArgumentParser, words: list[str]) -> tuple[argparse.ArgumentParser, list[str]]:
    """The parser of the sub-command ``words`` start with (``rules list``: two levels), and its name.

    Raises:
        AssertionError: the first word is not a sub-command.
    """
    names: list[str] = []
    current = parser
    rest = list(words)
    while rest and (subs := _subparsers(current)):
        if rest[0] not in subs:
            break
        names.append(rest[0])
        current = subs[rest.pop(0)]
    assert names, f"not a torchwatch command: {words[:1]}"
    return current, names


def _options(tokens: list[str]) -> list[str]:
    """The option names among ``tokens``, up to ``--`` (what follows is the training's command)."""
    found = []
    for token in tokens:
        if token == "--":
            break
        name = token.strip("[]").split("=", 1)[0]
        if name.startswith("-") and name != "-":
            found.append(name)
    return found


def check_torchwatch_command(
    text: str, parser: argparse.ArgumentParser | None = None, *, complete: bool = True
) -> list[str]:
    """Problems with one README command ``torchwatch SUB ...`` (``[]``: none).

    Its sub-command must exist, and every option it names must be an option string of that
    sub-command, exactly (argparse itself would accept an abbreviation). When ``complete`` (a
    command in a code block, not a mention in the text), then, with each placeholder replaced by a
    valid value and brackets taken away, the whole line must parse (values included), unless it asks
    for ``--help``.
    """
    parser = parser or build_parser()
    for placeholder in OPTIONAL_PLACEHOLDERS:
        text = text.replace(placeholder, "")
    for placeholder, value in PLACEHOLDERS.items():
        text = re.sub(rf"(?<![\w-]){re.escape(placeholder)}(?![\w-])", value, text)
    tokens = shlex.split(text)
    assert tokens[0] == "torchwatch", text
    try:
        leaf, names = _leaf(parser, [t for t in tokens[1:] if not t.startswith("-")][:2])
    except AssertionError as exc:
        return [f"{text!r}: {exc}"]
    known = set(leaf._option_string_actions)
    problems = [f"{text!r}: {' '.join(names)} has no option {o}" for o in _options(tokens[1:]) if o not in known]
    if problems or not complete or {"-h", "--help"} & set(_options(tokens[1:])):
        return problems
    argv = [t.strip("[]") for t in tokens[1:]]
    try:
        parser.parse_args(argv)
    except (UsageError, SystemExit) as exc:
        problems.append(f"{text!r}: does not parse: {getattr(exc, 'message', exc)}")
    return problems


def _ci_line() -> str:
    """The line of ``.ci/run`` that installs and runs the tests."""
    lines = [line.strip() for line in CI_RUN.read_text().splitlines() if "pytest" in line and "pip install" in line]
    assert len(lines) == 1, lines
    return lines[0]


def _setup_commands() -> list[Command]:
    """The commands of the README's first code block: the two set-up commands."""
    text = README.read_text()
    lang, first, lines = next(_code_blocks(text))
    assert lang == "bash"
    return [Command(first + i, _strip_comment(line)) for i, line in enumerate(lines) if _strip_comment(line)]


def _script_options(script: Path) -> set[str]:
    """Option names a demo script (or the ``demo/_common.py`` it parses its flags with) declares."""
    texts = [script.read_text()]
    common = script.parent / "_common.py"
    if common.exists():
        texts.append(common.read_text())
    return {m for t in texts for m in re.findall(r"add_argument\(\s*[\"'](--[\w-]+)", t)}


# -- the two set-up commands ------------------------------------------------------------------------
def test_the_readme_opens_with_the_two_set_up_commands() -> None:
    setup = _setup_commands()
    assert len(setup) == 2, setup
    assert setup[0].line <= 10, "the set-up commands are the first thing after the title"


def test_ci_runs_the_second_set_up_command_verbatim() -> None:
    assert _setup_commands()[1].text == _ci_line()


def test_the_first_set_up_command_is_made_of_valid_parts() -> None:
    install_torch, install_self, watch = (p.strip() for p in _setup_commands()[0].text.split("&&"))
    assert install_torch == _ci_line().split("&&")[0].strip(), "the same torch pin as CI"
    assert install_self == "pip install -e ."
    pyproject = (REPO / "pyproject.toml").read_text()
    assert 'name = "torchwatch-live"' in pyproject  # the distribution's own name; the import name is torchwatch
    assert re.search(r'^torchwatch = "torchwatch\.cli:\w+"', pyproject, re.M), "the console script"
    assert check_torchwatch_command(watch) == []
    training = shlex.split(watch.split(" -- ", 1)[1])
    assert training[0] == "python"
    script = REPO / training[1]
    assert script.is_file(), script
    unknown = set(_options(training[2:])) - _script_options(script)
    assert not unknown, f"{training[1]} has no option {sorted(unknown)}"


# -- every other command ------------------------------------------------------------------------------
# Installing torchwatch as a tool from the checkout: what .ci/wheel_check.sh does (with the built wheel).
TOOL_INSTALLS = ("pipx install .", "uv tool install .")


def test_the_tool_installs_are_what_ci_checks() -> None:
    check = (REPO / ".ci" / "wheel_check.sh").read_text()
    for command in TOOL_INSTALLS:
        tool, verb = command.rsplit(" ", 1)[0].split(" ", 1)
        assert re.search(rf'/{tool}"? {verb} [^\n]*"\$wheel"', check), command  # the built wheel, as the tool
    assert "wheel_check.sh" in CI_RUN.read_text()


def test_every_command_in_the_readme_is_a_set_up_command_or_parses() -> None:
    setup = {c.text for c in _setup_commands()}
    commands = readme_commands(README.read_text())
    assert len(commands) >= 10, "the extraction itself works"
    problems = []
    for command in commands:
        if command.text in setup or command.text in TOOL_INSTALLS:
            continue
        if not command.text.startswith("torchwatch "):
            problems.append(f"README line {command.line}: neither a set-up command nor torchwatch: {command.text!r}")
            continue
        found = check_torchwatch_command(command.text, complete=not command.inline)
        problems += [f"README line {command.line}: {p}" for p in found]
    assert not problems, "\n".join(problems)


def _option_table(text: str) -> list[tuple[int, list[str], list[str]]]:
    """The README's option table: per row, its line, the options of its first cell and the commands
    of its second (``every command``: every sub-command that takes no further sub-command)."""
    parser = build_parser()
    leaves: list[str] = []
    for name, sub in _subparsers(parser).items():
        inner = _subparsers(sub)
        leaves += [f"{name} {n}" for n in inner] if inner else [name]
    rows = []
    for number, line in enumerate(text.split("\n"), 1):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("`-"):
            continue
        options = [span.split()[0] for span in re.findall(r"`([^`]+)`", cells[0])]
        on = leaves if cells[1] == "every command" else [c.strip() for c in cells[1].split(",")]
        rows.append((number, options, on))
    return rows


def test_every_option_in_the_readme_table_exists_on_the_commands_it_names() -> None:
    parser = build_parser()
    rows = _option_table(README.read_text())
    assert len(rows) >= 8, "the table was found"
    problems = []
    for number, options, commands in rows:
        for command in commands:
            leaf, _ = _leaf(parser, command.split())
            problems += [
                f"README line {number}: {command} has no option {o}"
                for o in options
                if o not in leaf._option_string_actions
            ]
    assert not problems, "\n".join(problems)


def test_a_renamed_or_abbreviated_option_fails_the_check() -> None:
    """The check can fail: a name argparse would take as an abbreviation (``--kee`` for ``--keep``),
    an option of another sub-command, a value the option refuses, a sub-command that does not exist."""
    assert check_torchwatch_command("torchwatch trial PID SETTING=VALUE --keep") == []
    assert check_torchwatch_command("torchwatch trial PID SETTING=VALUE --kee")
    assert check_torchwatch_command("torchwatch burst PID --keep")
    assert check_torchwatch_command("torchwatch run --window 0.001 -- python train.py")
    assert check_torchwatch_command("torchwatch watch PID")
    assert check_torchwatch_command("torchwatch trial", complete=False) == []  # a mention in the text
    assert check_torchwatch_command("torchwatch trail", complete=False)
    assert check_torchwatch_command("torchwatch doctor --jsn", complete=False)


# -- size, the docs' index, links -------------------------------------------------------------------
def test_the_readme_is_short() -> None:
    data = README.read_bytes()
    lines = data.count(b"\n")
    assert lines <= MAX_LINES, f"{lines} lines"
    assert len(data) <= MAX_BYTES, f"{len(data)} bytes"


_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _links(path: Path) -> list[tuple[int, str]]:
    """The Markdown link targets of ``path`` outside code blocks and spans, with their line numbers."""
    text = path.read_text()
    text = FENCED.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    text = re.sub(r"`[^`\n]*`", "", text)
    return [(n, target) for n, line in enumerate(text.split("\n"), 1) for target in _LINK.findall(line)]


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but ``-`` and ``_`` dropped, spaces to ``-``."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    """The anchors of the headings of ``path`` (code blocks left out)."""
    text = FENCED.sub("", path.read_text())
    return {_slug(m) for m in re.findall(r"^#{1,6}\s+(.*?)\s*$", text, re.M)}


def _pages() -> list[Path]:
    return sorted(DOCS.glob("*.md")) if DOCS.is_dir() else []


def test_every_docs_page_is_linked_from_the_readme() -> None:
    linked = {(README.parent / t.split("#")[0]).resolve() for _, t in _links(README) if not t.startswith("#")}
    missing = [p.name for p in _pages() if p.resolve() not in linked]
    assert _pages(), "docs/ has pages"
    assert not missing, f"not linked from the README: {missing}"


@pytest.mark.parametrize("page", [README, *_pages()], ids=lambda p: p.name)
def test_every_relative_link_resolves_inside_the_repository(page: Path) -> None:
    problems = []
    for number, target in _links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not a file of the repository
            continue
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page.resolve()
        where = f"{page.name}:{number}: {target}"
        if not dest.is_relative_to(REPO):
            problems.append(f"{where} points outside the repository")
        elif not dest.exists():
            problems.append(f"{where} does not exist")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            problems.append(f"{where}: no heading #{anchor} in {dest.name}")
    assert not problems, "\n".join(problems)


def test_no_user_facing_text_points_outside_the_repository() -> None:
    outside = re.compile(r"\.\./shared|/work/|\b(DESIGN|FIELD|STYLE)\.md\b")
    cited = [p.name for p in [README, *_pages()] if outside.search(p.read_text())]
    assert not cited


def test_no_merge_conflict_is_left_in_the_readme_or_the_docs() -> None:
    marked = [p.name for p in [README, *_pages()] if re.search(r"^(<{7}|={7}|>{7})( |$)", p.read_text(), re.M)]
    assert not marked


# -- the tiers ------------------------------------------------------------------------------------------
STRESS_TESTS = {  # what the second tier holds (docs/development.md#tiers)
    "tests/integration/test_trial.py::test_fifty_trials_in_a_row_put_every_value_back_change_no_loss_and_leak_nothing",
    "tests/unit/test_hook.py::test_twenty_bursts_in_a_row_keep_rss_bounded",
    "tests/integration/test_fleet_netns.py::test_straggler_and_hang_of_a_two_node_job_named_by_prometheus",
}


def _collected(*args: str) -> set[str]:
    files = sorted({t.split("::")[0] for t in STRESS_TESTS} | {"tests/integration/test_inject_harm.py"})
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-n", "0", *args, *files],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode in (0, 5), run.stdout[-2000:] + run.stderr[-2000:]  # 5: nothing collected
    return {line.strip() for line in run.stdout.splitlines() if "::" in line}


def test_the_readme_command_leaves_the_stress_tier_to_ci_which_runs_it() -> None:
    default = _collected()
    stress = _collected("-m", "stress")
    assert stress >= STRESS_TESTS, STRESS_TESTS - stress
    assert any(t.startswith("tests/integration/test_inject_harm.py::") for t in stress)
    assert not (stress & default), stress & default  # the README's command does not run them
    assert default, "the files' other tests still run in the first tier"
    ci = [line.strip() for line in CI_RUN.read_text().splitlines() if not line.lstrip().startswith("#")]
    assert "python -m pytest -q -p no:cacheprovider -m stress" in ci
    assert ci.index("python -m pytest -q -p no:cacheprovider -m stress") > ci.index(_ci_line())

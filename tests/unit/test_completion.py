"""``torchwatch completion {bash,zsh,fish}``: made from the parser, so it knows every sub-command and
option; the bash script, sourced in a real bash, completes them."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from torchwatch.cli import build_parser, main
from torchwatch.cli.completion import commands

SHELLS = ("bash", "zsh", "fish")


def _script(shell: str, capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["completion", shell]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("shell", SHELLS)
def test_the_script_names_every_sub_command_and_option(shell: str, capsys: pytest.CaptureFixture[str]) -> None:
    text = _script(shell, capsys)
    every = commands(build_parser())
    assert {"run", "attach", "trial", "rules check", "completion"} <= set(every)
    for path, parser in every.items():
        if path:
            assert path.split()[-1] in text, path
        for action in parser._actions:
            for option in action.option_strings:
                name = option.lstrip("-")
                assert (
                    (f"-l {name}" if option.startswith("--") else f"-s {name}") in text
                    if shell == "fish"
                    else (option in text)
                ), (path, option)


def _complete(script: str, *words: str) -> list[str]:
    """What bash's completion function offers for ``torchwatch WORDS`` (the last word being typed)."""
    line = " ".join(f"'{w}'" for w in ("torchwatch", *words))
    code = (
        f"{script}\ncomplete -p torchwatch || exit 9\n"
        f"COMP_WORDS=({line}); COMP_CWORD={len(words)}; _torchwatch; printf '%s\\n' \"${{COMPREPLY[@]}}\""
    )
    r = subprocess.run(["bash", "--norc", "-c", code], capture_output=True, text=True, timeout=30, check=True)
    return r.stdout.split("\n")[1:-1]  # the first line is complete -p's


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash here")
def test_bash_completes_sub_commands_options_and_choices(capsys: pytest.CaptureFixture[str]) -> None:
    script = _script("bash", capsys)
    top = _complete(script, "")
    assert {"run", "attach", "detach", "burst", "trial", "rules", "doctor", "compare", "serve", "completion"} <= set(
        top
    )
    assert _complete(script, "run", "--du") == ["--duration"]
    assert _complete(script, "attach", "--keep") == ["--keep-hook"]
    assert set(_complete(script, "run", "--sampling", "")) == {"adaptive", "fast"}
    assert set(_complete(script, "rules", "")) >= {"check", "list"}
    assert _complete(script, "--log-file", "x.log", "trial", "--allow") == ["--allow-numerics"]  # a value is skipped
    assert {"bash", "zsh", "fish"} <= set(_complete(script, "completion", ""))  # its choices


@pytest.mark.skipif(shutil.which("zsh") is None, reason="no zsh here")
def test_zsh_reads_its_script(capsys: pytest.CaptureFixture[str]) -> None:
    r = subprocess.run(["zsh", "-n"], input=_script("zsh", capsys), capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr


def test_another_shell_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["completion", "powershell"]) == 2
    assert "powershell" in capsys.readouterr().err

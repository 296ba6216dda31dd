"""Install torchwatch as a user would, into fresh virtual environments, and run its unit tests there.

    python .ci/venv_tests.py [--lowest] [--torch] PYTHON [PYTHON ...]

For each PYTHON (a path, or a version such as 3.12 found in pyenv): a new venv, ``pip install .``
(not editable: the wheel a user gets) with the test tools, then ``pytest tests/unit`` run from a
copy of ``tests/`` outside the source tree, so the installed package is what gets imported.
Tests that need torch are skipped unless ``--torch`` installs it (``torch==2.13.0``, CPU build).

--lowest pins every dependency and test tool to the lower bound pyproject.toml gives it
(``name>=X`` becomes ``name==X``): the bounds must be true, not hopes. The SVG snapshots of the TUI
are left out then: they record one rendering, made with the newest Textual and rich, and older
releases draw the same screens with other spacing and colours.

First of all, the wheel is built once and its build log checked: a setuptools warning fails.
Exits non-zero when any step fails; prints one summary line per Python.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parents[1]
TORCH = "torch==2.13.0"
PYENV = Path.home() / ".pyenv" / "versions"


def find_python(spec: str) -> Path:
    """A Python interpreter: ``spec`` itself, or the newest pyenv install of that version."""
    if Path(spec).exists():
        return Path(spec)
    found = sorted(PYENV.glob(f"{spec}.*/bin/python{spec}")) or sorted(PYENV.glob(f"{spec}*/bin/python3"))
    if not found:
        sys.exit(f"venv_tests: no Python {spec} (looked in {PYENV})")
    return found[-1]


def requirements(lowest: bool, with_torch: bool) -> list[str]:
    """The dependencies and the ``test`` extra, as pyproject.toml states them or at their lower bounds."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = [*project["dependencies"], *project["optional-dependencies"]["test"]]
    out = []
    for req in wanted:
        name = re.split(r"[<>=!~;\[ ]", req, maxsplit=1)[0]
        if name == "torch":
            if with_torch:
                out.append(TORCH)
            continue
        if lowest:
            bound = re.search(r">=\s*([^,; ]+)", req)
            if bound is None:
                sys.exit(f"venv_tests: {req!r} has no lower bound to test")
            marker = req.split(";", 1)[1] if ";" in req else ""
            req = f"{name}=={bound.group(1)}" + (f"; {marker.strip()}" if marker else "")
        out.append(req)
    return out


def run(cmd: list[str], log: Path, cwd: Path | None = None) -> None:
    """Run ``cmd``, appending its output to ``log``; exit with the log's tail when it fails."""
    with log.open("a") as f:
        f.write(f"$ {' '.join(cmd)}\n")
        f.flush()
        result = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=cwd)
    if result.returncode != 0:
        print(log.read_text()[-4000:], file=sys.stderr)
        sys.exit(f"venv_tests: failed ({result.returncode}): {' '.join(cmd)}; log: {log}")


def build_wheel(work: Path) -> Path:
    """Build the wheel once; its log must hold no setuptools warning."""
    log = work / "build.log"
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-v", "-w", str(work / "dist"), str(REPO)], log)
    warnings = [ln for ln in log.read_text().splitlines() if re.search(r"\bwarning\b", ln, re.I)]
    # pip's own notices (running as root) and "byte-compiling is disabled" (PYTHONDONTWRITEBYTECODE)
    # say nothing about the project; any other warning is the packaging configuration's.
    ignored = ("byte-compiling is disabled", "Running pip as the 'root' user")
    bad = [ln for ln in warnings if not any(i in ln for i in ignored)]
    if bad:
        sys.exit("venv_tests: the build warns:\n" + "\n".join(bad))
    return next((work / "dist").glob("torchwatch-*.whl"))


def check(python: Path, wheel: Path, work: Path, lowest: bool, with_torch: bool) -> str:
    """One fresh venv for ``python``: install, run the unit tests; a summary line."""
    venv = work / f"venv-{python.parent.parent.name}"
    log = work / f"{venv.name}.log"
    started = time.monotonic()
    run([str(python), "-m", "venv", str(venv)], log)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    run([*pip, *requirements(lowest, with_torch)], log)
    run([*pip, "--no-deps", str(wheel)], log)
    tests = work / f"tests-{venv.name}"
    shutil.copytree(REPO / "tests", tests / "tests")
    shutil.copy(REPO / "pyproject.toml", tests)  # pytest's markers and options, nothing to import
    probe = "import torchwatch, sys; print(torchwatch.__file__); sys.exit('site-packages' not in torchwatch.__file__)"
    run([str(venv / "bin" / "python"), "-c", probe], log, cwd=tests)
    cmd = [str(venv / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", "tests/unit"]
    if lowest:
        cmd.append("--ignore=tests/unit/test_tui_snapshots.py")
    with log.open("a") as f:
        result = subprocess.run(cmd, cwd=tests, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        f.write(result.stdout)
    tail = [ln for ln in result.stdout.splitlines() if re.search(r"\d+ (passed|failed|error)", ln)]
    versions = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "freeze"], capture_output=True, text=True
    ).stdout.split()
    pinned = [
        v
        for v in versions
        if re.match(
            r"(textual|rich|psutil|nvidia-ml-py|py-spy|pytest|pytest-xdist|hypothesis|jsonschema|pytest-textual-snapshot)==",
            v,
            re.I,
        )
    ]
    line = (
        f"Python {python.parent.parent.name}: {tail[-1] if tail else 'no result'} in {time.monotonic() - started:.0f} s"
    )
    if result.returncode != 0:
        print(result.stdout[-6000:], file=sys.stderr)
        sys.exit(f"venv_tests: unit tests failed on {python}; log: {log}\n{line}")
    return f"{line} [{' '.join(pinned)}]"


def main() -> None:
    """Parse the arguments, build once, check every Python."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lowest", action="store_true", help="pin every dependency to its lower bound")
    parser.add_argument("--torch", action="store_true", help=f"install {TORCH} too (the torch tests then run)")
    parser.add_argument("pythons", nargs="+", metavar="PYTHON")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="torchwatch-venv-tests-"))
    wheel = build_wheel(work)
    print(f"built {wheel.name} without warnings", flush=True)
    for spec in args.pythons:
        print(check(find_python(spec), wheel, work, args.lowest, args.torch), flush=True)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

"""The hook's shape (issue 54): no class in ``torchwatch/hook/`` over :data:`MAX_CLASS_LINES`
lines, and requests passed typed (``wire.Request``'s classes), never as dicts, from the reader
that writes ``request.json`` to the hook that decodes it once."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import torchwatch

PACKAGE = Path(torchwatch.__file__).parent
MAX_CLASS_LINES = 400  # a class past this is a room every feature walks through (Hook was 895)

# Where requests travel: the reader's side (sources/hook.py, watch/trials.py, the commands that
# ask) and every module of the hook.
REQUEST_MODULES = ("sources/hook.py", "watch/trials.py", "cli/burst.py", "cli/trial.py", "hook/*.py")
REQUEST_PARAMS = {"req", "request", "raw", "params", "payload", "stop"}
UNTYPED = ("dict", "Dict", "Mapping", "Any", "object")


def long_classes(root: Path, limit: int = MAX_CLASS_LINES) -> list[str]:
    """``module:Class (N lines)`` for each class under ``root`` longer than ``limit`` lines."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > limit:
                    found.append(f"{path.relative_to(root)}:{node.name} ({lines} lines)")
    return found


def untyped_requests(package: Path) -> list[str]:
    """``module:function(param: annotation)`` for each request parameter (or the return of a
    function named ``*request*``) annotated with a dict, a Mapping, ``Any`` or ``object``."""
    found = []
    for pattern in REQUEST_MODULES:
        for path in sorted(package.glob(pattern)):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                args = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
                named = "request" in node.name
                for arg in args:
                    if arg.arg in REQUEST_PARAMS or (named and arg.arg not in ("self", "cls", "now", "step")):
                        text = ast.unparse(arg.annotation) if arg.annotation is not None else "Any"
                        if any(word in text.replace("[", " ").replace("|", " ").split() for word in UNTYPED):
                            found.append(f"{path.relative_to(package)}:{node.name}({arg.arg}: {text})")
                if named and node.returns is not None:
                    text = ast.unparse(node.returns)
                    if any(word in text.replace("[", " ").replace("|", " ").split() for word in UNTYPED):
                        found.append(f"{path.relative_to(package)}:{node.name} -> {text}")
    return found


def test_no_class_of_the_hook_is_over_400_lines() -> None:
    assert long_classes(PACKAGE / "hook") == []


def test_the_measure_sees_a_long_class(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_CLASS_LINES))
    (tmp_path / "m.py").write_text(f"class Short:\n    pass\n\n\nclass Long:\n{body}\n")
    assert long_classes(tmp_path) == [f"m.py:Long ({MAX_CLASS_LINES + 1} lines)"]


def test_requests_are_typed_from_the_reader_to_the_hook() -> None:
    assert untyped_requests(PACKAGE) == []


@pytest.mark.parametrize(
    ("source", "found"),
    [
        ("def request_burst(self, params: dict[str, Any] | None = None) -> None: ...", "params: dict[str, Any] | None"),
        ("def on_request(self, req: Mapping[str, object], now: float) -> None: ...", "req: Mapping[str, object]"),
        ("def _take_request(self) -> dict[str, Any] | None: ...", "-> dict[str, Any] | None"),
        ("def request_trial(self, r) -> None: ...", "r: Any"),
    ],
)
def test_the_measure_sees_a_dict_request(tmp_path: Path, source: str, found: str) -> None:
    (tmp_path / "hook").mkdir()
    (tmp_path / "hook" / "x.py").write_text(source + "\n")
    (bad,) = untyped_requests(tmp_path)
    assert bad.endswith(found + ("" if found.startswith("->") else ")"))

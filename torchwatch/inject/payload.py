"""The Python source that runs inside the target, built by torchwatch and never imported by it.

Both injectors run the source as top-level code of the target's ``__main__`` (hypno through
``PyRun_SimpleString``, PEP 768 like a script), so the source is a single ``try`` statement
that binds no name there and lets no exception out (a ``SystemExit`` escaping
``PyRun_SimpleString`` would end the training). Inside, in a fresh namespace, it:

1. does nothing at all when torchwatch has given up (its result directory is gone or the
   deadline has passed: ``sys.remote_exec`` runs the code whenever the target reaches a
   safe point, possibly late);
2. imports the entry point's module from torchwatch's install directory by its path
   (:mod:`torchwatch.wire.bypath`, as the ``run`` bootstrap does: by the name ``torchwatch`` only
   when that name is this very package in the target, otherwise under a private name, so a
   ``torchwatch`` of the target's own is neither used nor shadowed), and calls ``module.function()``;
3. on any failure removes the modules of the entry point's package it imported, writes one
   line to the target's stderr (nothing is written on success), and re-delivers a Ctrl-C
   that arrived meanwhile;
4. writes ``result.json`` (created exclusively, not following links, 0600, then renamed) in
   the directory torchwatch made for it.

With ``thread=True`` the injected call only starts a thread that does 2-4, so the target's
main thread is held for as short as possible and the work runs like any other Python thread
(between bytecodes, under the GIL); ``thread=False`` runs it on the main thread during the
injection, for work that must happen there (installing a signal handler). Before starting
the thread it imports ``threading`` on the main thread when the target has not: imported
first from another thread, ``threading.main_thread()`` would name that thread forever.
"""

from __future__ import annotations

from typing import Any

SCHEMA = "torchwatch.inject/1"
RESULT_FILE = "result.json"
MAX_RESULT_BYTES = 64 * 1024

_BODY = r"""
def _torchwatch_injected(p):
    import os, sys, time
    out = p["out"]
    if time.time() > p["deadline"] or not os.path.isdir(out):
        return
    started = time.monotonic()
    result = {"schema": p["schema"], "token": p["token"], "ok": False, "error": None, "value": None,
              "pid": os.getpid(), "python": "%d.%d.%d" % tuple(sys.version_info[:3]), "module_file": None}

    def finish():
        import json
        data = json.dumps(result, default=str).encode()
        if len(data) > p["max_bytes"]:
            result.update(ok=False, value=None, error="result larger than %d bytes" % p["max_bytes"])
            data = json.dumps(result, default=str).encode()
        tmp = os.path.join(out, ".result-%d.tmp" % os.getpid())
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        os.replace(tmp, os.path.join(out, p["result"]))

    import _thread
    main_ident = _thread.get_ident()  # this code starts on the main thread

    def run():
        result["main_thread"] = _thread.get_ident() == main_ident
        before = set(sys.modules)
        packages = (p["module"].split(".")[0], "_torchwatch_by_path")
        try:
            import importlib.util
            if packages[0] == "torchwatch":
                where = os.path.join(p["path"], "torchwatch", "wire", "bypath.py")
                if not os.path.isfile(where):
                    raise ImportError("%s is missing" % where)
                spec = importlib.util.spec_from_file_location("_torchwatch_bypath", where)
                if spec is None or spec.loader is None:
                    raise ImportError("cannot read %s" % where)
                bypath = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(bypath)
                module = bypath.load(p["path"], p["module"])
            else:  # another package (the tests'): from p["path"], appended to sys.path while importing
                added = p["path"] not in sys.path
                if added:
                    sys.path.append(p["path"])
                try:
                    module = importlib.import_module(p["module"])
                finally:
                    if added and p["path"] in sys.path:
                        sys.path.remove(p["path"])
            result["module_file"] = getattr(module, "__file__", None)
            result["module_name"] = getattr(module, "__name__", None)
            result["value"] = getattr(module, p["function"])()
            result["ok"] = True
        except BaseException as exc:
            for name in set(sys.modules) - before:
                if name.split(".")[0] in packages:
                    sys.modules.pop(name, None)
            result["error"] = ("%s: %s" % (type(exc).__name__, exc))[:500]
            try:
                sys.stderr.write("torchwatch: injected code failed and was undone: %s\n" % result["error"])
                sys.stderr.flush()
            except BaseException:
                pass
            if isinstance(exc, KeyboardInterrupt):
                _thread.interrupt_main()
        result["run_s"] = time.monotonic() - started
        try:
            finish()
        except BaseException:
            pass

    if p["thread"]:
        # threading, imported first from another thread, would take that thread for the main one
        import threading
        _thread.start_new_thread(run, ())
    else:
        run()
"""


def source(params: dict[str, Any]) -> str:
    """The code to run in the target.

    Args:
        params: ``out`` (result directory), ``token`` (echoed back, so a stale or forged file is
            told apart), ``deadline`` (``time.time()`` after which the code does nothing),
            ``module``, ``function``, ``path`` (the directory holding the torchwatch package the
            module is loaded from, :func:`torchwatch.wire.bypath.load`),
            ``thread`` (bool); ``schema``, ``result`` and ``max_bytes`` are filled in here.
            Values must be str, float, int or bool (they are embedded with ``repr``).

    Returns:
        Python source text, a few KiB (hypno's limit is 60,500 bytes).
    """
    full = {"schema": SCHEMA, "result": RESULT_FILE, "max_bytes": MAX_RESULT_BYTES, **params}
    for key, value in full.items():
        if not isinstance(value, (str, int, float, bool)):
            raise TypeError(f"payload parameter {key} must be a str, int, float or bool, not {type(value).__name__}")
    inner = _BODY + f"\n_torchwatch_injected({full!r})\n"
    return (
        "try:\n"
        f"    __import__('builtins').exec({inner!r}, "
        "{'__name__': '__torchwatch_inject__', '__builtins__': __import__('builtins')})\n"
        "except BaseException:\n"
        "    pass\n"
    )

"""Running Python code inside a live training process, and the checks made before doing so.

- :mod:`~torchwatch.inject.facts`: what ``/proc`` says about torchwatch and the target;
- :mod:`~torchwatch.inject.checks`: whether injection is allowed and safe, each refusal with its fix;
- :mod:`~torchwatch.inject.injector`: :func:`~torchwatch.inject.injector.inject`, which runs an
  entry point of a module from torchwatch's own install inside the target and reads back its result;
- :mod:`~torchwatch.inject.probe`: a standard-library-only entry point that only reports back.

This ``__init__`` imports nothing: the target imports ``torchwatch.inject.probe`` through it,
and the target may lack torchwatch's dependencies.
"""

"""`MODULE:FACTORY`: a Python module (dotted path or .py file) and a function in it
that returns (model, example_inputs), as the `tori` command's subcommands take it.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
import traceback
from pathlib import Path
from typing import Any, Callable

from tori.errors import InputError, OptionsError


def load_factory(spec: str) -> Callable[[], tuple[Any, tuple]]:
    module_name, _, factory_name = spec.rpartition(":")
    if not module_name or not factory_name:
        raise OptionsError("model", spec, ["MODULE:FACTORY, e.g. benchmarks/examples.py:mlp or pkg.models:make"])
    path = Path(module_name)
    if path.suffix == ".py" or path.exists():
        if not path.is_file():
            raise OptionsError("model file", module_name, ["an existing .py file"])
        # Sibling modules of the file import as they would when it runs as a script.
        sys.path.insert(0, str(path.resolve().parent))
        unique = f"_tori_factory_{path.stem}"
        module_spec = importlib.util.spec_from_file_location(unique, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[unique] = module
        module_spec.loader.exec_module(module)
    else:
        # A module in the current directory imports as `python -c 'import mymodels'` would.
        if "" not in sys.path and os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if error.name is None or not module_name.startswith(error.name):
                raise  # the module was found, and one that it imports is missing: the user's to see
            raise OptionsError("model module", module_name, [], message=(
                f"no module named {module_name!r} (as MODULE:FACTORY): give a dotted module importable from the "
                f"current directory or PYTHONPATH, or the path of a .py file, e.g. models.py:{factory_name}")) \
                from None
    factory = getattr(module, factory_name, None)
    if not callable(factory):
        raise OptionsError(f"factory in {module_name}", factory_name, _factories(module), unknown=True)
    return factory


def _factories(module) -> list[str]:
    """The functions a module defines itself (not the classes or functions it imports)."""
    return sorted(name for name, value in vars(module).items()
                  if inspect.isfunction(value) and not name.startswith("_")
                  and getattr(value, "__module__", None) == module.__name__)


def load_model(spec: str) -> tuple[Any, tuple]:
    """Call the factory; example inputs come back as a tuple of positional arguments."""
    factory = load_factory(spec)
    try:
        made = factory()
    except Exception as error:
        frame = traceback.extract_tb(error.__traceback__)[-1]
        raise InputError(f"the factory {spec} raised {type(error).__name__}: {error} (at {frame.filename}:"
                         f"{frame.lineno}); run it in Python to see the whole traceback") from error
    if not (isinstance(made, tuple) and len(made) == 2):
        raise OptionsError("factory result", type(made).__name__, ["(model, example_inputs)"])
    model, inputs = made
    return model, tuple(inputs) if isinstance(inputs, (list, tuple)) else (inputs,)

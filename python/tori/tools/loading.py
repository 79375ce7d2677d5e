"""`MODULE:FACTORY`: a Python module (dotted path or .py file) and a function in it
that returns (model, example_inputs), as the `tori` command's subcommands take it.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any, Callable

from tori.errors import OptionsError


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
        module = importlib.import_module(module_name)
    factory = getattr(module, factory_name, None)
    if not callable(factory):
        names = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        raise OptionsError(f"factory in {module_name}", factory_name, names)
    return factory


def load_model(spec: str) -> tuple[Any, tuple]:
    """Call the factory; example inputs come back as a tuple of positional arguments."""
    made = load_factory(spec)()
    if not (isinstance(made, tuple) and len(made) == 2):
        raise OptionsError("factory result", type(made).__name__, ["(model, example_inputs)"])
    model, inputs = made
    return model, tuple(inputs) if isinstance(inputs, (list, tuple)) else (inputs,)

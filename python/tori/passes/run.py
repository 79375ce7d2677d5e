"""Run a tori pass pipeline over an MLIR file: `python -m tori.passes.run FILE --pipeline P`.

Prints the resulting IR; the command that tori's repro files name for the `tori` stage.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from torch_mlir import ir

from tori.errors import ToriError
from tori.frontend.importer import new_context
from tori.passes import run_pipeline


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tori.passes.run", description=__doc__)
    parser.add_argument("file", type=Path, help="MLIR file (text) in the torch dialect")
    parser.add_argument("--pipeline", default="", help="comma-separated pass names")
    args = parser.parse_args(argv)
    context = new_context()
    module = ir.Module.parse(args.file.read_text(), context=context)
    try:
        run_pipeline(module, args.pipeline, graph=args.file.stem)
    except ToriError as error:
        print(error, file=sys.stderr)
        return 1
    print(module)
    return 0


if __name__ == "__main__":
    sys.exit(main())

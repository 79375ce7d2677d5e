"""Options of tori: one frozen dataclass, read from `torch.compile(options=...)`
and from TORI_* environment variables in one place.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import json
import os
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from tori.errors import OptionsError
from tori.targets import SPECS, Target


# The tori pass pipeline run when options name none, per target; here rather than in
# tori.passes, which imports MLIR and every pass, so that reading options stays light.
# The fusion passes (tori-fuse-attention, tori-fuse-layer-norm) cut IREE dispatches but
# were not faster on the CPU benchmarks, so the CPU (and Vulkan, measured on lavapipe, a
# CPU) leave them out; CUDA and ROCm run them: IREE's fused attention kernel is its fast
# path on those GPUs. docs/passes.md has the figures.
DEFAULT_PIPELINE = "tori-fold-empty-tensors, tori-fold-constants, tori-specialize-guards"
FUSED_ATTENTION_PASS = "tori-fuse-attention"
GPU_PIPELINE = f"{DEFAULT_PIPELINE}, {FUSED_ATTENTION_PASS}, tori-fuse-layer-norm"
DEFAULT_PIPELINES = {Target.CPU: DEFAULT_PIPELINE, Target.VULKAN: DEFAULT_PIPELINE,
                     Target.CUDA: GPU_PIPELINE, Target.ROCM: GPU_PIPELINE}


class Fallback(str, enum.Enum):
    EAGER = "eager"  # run a graph that cannot be compiled in eager PyTorch, with a warning
    ERROR = "error"  # raise tori.errors.CompileError


class Driver(str, enum.Enum):
    AUTO = "auto"  # measure local-sync and local-task on the first calls, keep the faster
    LOCAL_SYNC = "local-sync"
    LOCAL_TASK = "local-task"


class Codegen(str, enum.Enum):
    AUTO = "auto"  # code generation chosen per graph from the op families it holds (targets/codegen.py)
    NONE = "none"  # IREE's default lowering for every graph


def _enum_value(enum_cls: type[enum.Enum], what: str, value: Any) -> enum.Enum:
    if isinstance(value, enum_cls):
        return value
    try:
        return enum_cls(value)
    except ValueError:
        raise OptionsError(what, value, [m.value for m in enum_cls], unknown=True) from None


@dataclass(frozen=True)
class Options:
    """Everything that changes how tori compiles and runs a graph."""

    target: Target = Target.CPU
    # More targets to compile each graph for beside `target` (one module each); at run
    # time the inputs' device picks among them (docs/targets.md).
    targets: tuple[Target, ...] = ()
    # Device model per GPU target: CUDA SM architecture, Vulkan target environment, ROCm chip.
    cuda_arch: str = SPECS[Target.CUDA].default_arch
    vulkan_target: str = SPECS[Target.VULKAN].default_arch
    rocm_chip: str = SPECS[Target.ROCM].default_arch
    fallback: Fallback = Fallback.EAGER
    # With fallback 'eager': a graph that fails on a few ops is split around them; the
    # rest compiles in parts, those ops run eagerly (frontend/partition.py). Off: the
    # whole graph runs eagerly.
    partition: bool = True
    # Checks compiled into modules where eager raises on bad values: indices out of
    # range, integer division by zero (frontend/decomp/checks.py). Off: such inputs
    # read and write out of bounds, as in IREE itself.
    runtime_checks: bool = True
    driver: Driver = Driver.AUTO
    # LLVM CPU name for llvm-cpu; "host" is resolved to the actual CPU of this machine.
    cpu: str = "host"
    # How code is generated for the op families of a graph (convolutions, matmuls):
    # "auto" picks IREE flags per graph and target from the table in targets/codegen.py;
    # "none" keeps IREE's defaults. Flags named in iree_flags take precedence.
    codegen: Codegen = Codegen.AUTO
    # Inference on the CPU: parameters and buffers held by the module as globals, loaded
    # once (their data-tiled packing then runs at load, not per call; frontend/resident.py).
    resident_weights: bool = True
    # Resident weights' packed memory collapsed into 2 MiB pages after each load (Linux;
    # runtime/huge_pages.py; docs/performance.md, "Resident weights in 2 MiB pages").
    huge_pages: bool = True
    # Extra flags appended to every iree-compile invocation.
    iree_flags: tuple[str, ...] = ()
    # tori pass pipeline applied at the `tori` stage (comma-separated pass names; "" runs
    # none); None: the target's default (DEFAULT_PIPELINES; see `tori_pipeline`).
    pipeline: str | None = None
    # Where failing IR and its reproducer command are written.
    repro_dir: Path = field(default_factory=lambda: Path(tempfile.gettempdir()) / "tori-repro")
    # When set, every stage of every compiled graph is written here (docs/inspect.md).
    dump_dir: Path | None = None
    # With dump_dir: also IREE's own phases (iree-compile --dump-compilation-phases-to).
    dump_iree_phases: bool = False
    # Dumps and reports elide large constants unless this is set.
    dump_large_constants: bool = False
    # When set, an HTML compile report of the graphs compiled with these options is written here.
    report: Path | None = None
    # iree-compile is killed after this many seconds (or at once when it repeats a
    # diagnostic without end). The slowest real-model compile measured takes 16 s
    # (MobileNetV3 and EfficientNet-B0, 2 cores; docs/reliability.md): 300 s leaves a
    # model many times that size room, and a stuck compile costs minutes, not 15.
    compile_timeout_s: float = 300.0
    # Graphs with dynamic shapes: at most this many static-shape variants per graph,
    # one for each input size seen `specialize_after` times (0: off; frontend/shape_variants.py).
    # On by default: Dynamo makes a graph dynamic on its own (a second model through the
    # same forward code, a recompile after a new size), and IREE's dynamic-shape code ran
    # mlp 2.3x and cnn_bn 6.8x slower than eager where static variants ran 1.2x and 0.9x.
    specialize_shapes: int = 4
    specialize_after: int = 3
    # The compile cache (tori/cache.py): on/off, its local directory, its size bound
    # (least recently used entries go first), and a shared Redis cache above it.
    cache: bool = True
    cache_dir: Path = field(default_factory=lambda: _default_cache_dir())
    cache_max_bytes: int = 4 << 30
    cache_url: str | None = None
    # Processes that compile the same graph at once compile it once: one compiles, the
    # others wait for its cache entry this many seconds at most, then compile themselves.
    cache_wait_s: float = 600.0

    @property
    def tori_pipeline(self) -> str:
        """The pipeline these options run: `pipeline`, or the default of the targets
        compiled (`target` and `targets`: one module is lowered for all of them), the
        GPU pipeline only where every one of them takes it (IREE's SPIR-V backend cannot
        compile the fused attention op that the GPU pipeline makes)."""
        if self.pipeline is not None:
            return self.pipeline
        defaults = {DEFAULT_PIPELINES[t] for t in (self.target, *self.targets)}
        return defaults.pop() if len(defaults) == 1 else DEFAULT_PIPELINE

    def replace(self, **changes: Any) -> "Options":
        return dataclasses.replace(self, **changes)

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def from_mapping(cls, options: Mapping[str, Any] | None, base: "Options | None" = None) -> "Options":
        """Validate user options (e.g. `torch.compile(..., options={...})`) over a base,
        by default the current `tori.compiler.config`."""
        base = base if base is not None else config.options()
        if options is not None and not isinstance(options, Mapping):
            raise OptionsError("options", options, ["a dict of tori options, e.g. {'fallback': 'error'}"],
                               message=f"options must be a dict of tori options, not {type(options).__name__} "
                                       f"{options!r}; e.g. options={{'fallback': 'error'}}")
        if not options:
            return base
        unknown = sorted(set(options) - set(cls.names()))
        if unknown:
            raise OptionsError(
                "tori option", unknown[0], cls.names(), unknown=True,
                hint="Pass options as torch.compile(model, backend='tori', options={...})",
            )
        return base.replace(**{k: _coerce(k, v) for k, v in options.items()})


def _default_cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tori"


_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def _size(name: str, value: Any) -> int:
    """Bytes, from an integer or a string such as "512M" or "2G"."""
    if isinstance(value, str):
        text = value.strip().upper().removesuffix("B").removesuffix("I")
        unit = text[-1:] if text[-1:] in _SIZE_UNITS else ""
        try:
            value = int(float(text[:len(text) - len(unit)]) * _SIZE_UNITS[unit])
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise OptionsError(name, value, ["a positive number of bytes, e.g. 2G or 512M"])
    return value


def _iree_flags(value: Any) -> tuple[str, ...]:
    """iree-compile flags from a sequence, a string of flags separated by spaces
    ("--a --b=1", as TORI_IREE_FLAGS) or a JSON list of strings ('["--a"]', as the
    CLI's --option takes it). Every item must be a flag: iree-compile reads any
    other word as a second input file."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                value = json.loads(text)
            except json.JSONDecodeError as error:
                raise OptionsError("iree_flags", value, ['a JSON list of flags, e.g. ["--iree-opt-level=O3"]'],
                                   hint=f"It does not parse: {error}") from None
        else:
            value = text.split()
    if not isinstance(value, (list, tuple)):
        raise OptionsError("iree_flags", value, ['iree-compile flags, e.g. ("--iree-opt-level=O3",)'])
    flags = tuple(str(v) for v in value)
    for flag in flags:
        if not flag.startswith("--"):
            raise OptionsError("iree_flags", flag, ["an iree-compile flag starting with --"],
                               message=f"invalid iree_flags item {flag!r}: each item is one iree-compile flag "
                                       f"starting with -- (e.g. --iree-opt-level=O3)",
                               hint="`iree-compile --help` lists them")
        _check_stack_safe(flag)
    return flags


# The stack of each of IREE's worker threads (its runtime's `--task_worker_stack_size`),
# on which a dispatch runs: what a dispatch puts on it beyond this crashes the process.
_WORKER_STACK_BYTES = 128 * 1024


def _check_stack_safe(flag: str) -> None:
    """Refuse the iree-compile flags that let a dispatch outgrow a worker's stack: with
    IREE's check of vector sizes off, MobileNetV3's graph at 8 images compiled vectors
    of 32 KiB and its first call died of a segmentation fault (docs/performance.md)."""
    name, _, value = flag.partition("=")
    if name == "--iree-llvmcpu-fail-on-large-vector" and value.lower() in ("false", "0"):
        reason = ("IREE's check of vector sizes keeps a dispatch's vectors, and what they spill, within "
                  "the 128 KiB stack of IREE's worker threads; without it a call can crash the process")
    elif name == "--iree-llvmcpu-stack-allocation-limit" and value.isdigit() and int(value) >= _WORKER_STACK_BYTES:
        reason = (f"a dispatch may then allocate {int(value)} bytes on the stack of IREE's worker threads, "
                  "which hold 128 KiB: a call can crash the process")
    else:
        return
    raise OptionsError("iree_flags", flag, ["flags that keep dispatches within IREE's worker stacks"],
                       message=f"iree_flags item {flag!r} is refused: {reason}",
                       hint="Remove it; where iree-compile fails without it, tori compiles the graph on "
                            "IREE's other paths")


def _coerce(name: str, value: Any) -> Any:
    if name == "target":
        return _enum_value(Target, "target", value)
    if name == "targets":
        values = value.replace(",", " ").split() if isinstance(value, str) else list(value)
        return tuple(dict.fromkeys(_enum_value(Target, "target", v) for v in values))
    if name == "fallback":
        return _enum_value(Fallback, "fallback", value)
    if name == "driver":
        return _enum_value(Driver, "driver", value)
    if name == "codegen":
        return _enum_value(Codegen, "codegen", value)
    if name in ("repro_dir", "dump_dir", "report", "cache_dir"):
        if value is None and name != "cache_dir":
            return None
        if not isinstance(value, (str, os.PathLike)) or not str(value):
            raise OptionsError(name, value, ["a path (str or os.PathLike)"])
        return Path(value).expanduser() if name == "cache_dir" else Path(value)
    if name in ("dump_iree_phases", "dump_large_constants", "cache", "partition", "runtime_checks", "resident_weights",
                "huge_pages"):
        return _flag(name, value)
    if name == "cache_max_bytes":
        return _size(name, value)
    if name == "cache_url":
        if value in (None, ""):
            return None
        if not isinstance(value, str) or not value.startswith(("redis://", "rediss://", "unix://")):
            raise OptionsError(name, value, ["redis://host:port/db", "rediss://...", "unix:///path/to/socket"])
        return value
    if name == "iree_flags":
        return _iree_flags(value)
    if name in ("compile_timeout_s", "cache_wait_s"):
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            seconds = -1.0
        if isinstance(value, bool) or not (seconds > 0 or (name == "cache_wait_s" and seconds == 0)):
            raise OptionsError(name, value, ["a positive number of seconds" if name == "compile_timeout_s"
                                             else "a number of seconds, 0 or more"])
        return seconds
    if name in _COUNTS:
        return _count(name, value, _COUNTS[name])
    if name == "pipeline" and value is None:
        return None
    if name in ("cpu", "pipeline", "cuda_arch", "vulkan_target", "rocm_chip"):
        if not isinstance(value, str):
            raise OptionsError(name, value, ["a string"])
        if name == "pipeline":
            from tori.passes import validate_pipeline

            return validate_pipeline(value)
        if name == "cpu":
            from tori.targets.cpu import check_cpu

            return check_cpu(value)
        return value
    return value


# Integer options and their least valid value.
_COUNTS = {"specialize_shapes": 0, "specialize_after": 1}


def _count(name: str, value: Any, least: int) -> int:
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise OptionsError(name, value, [f"an integer >= {least}"])
    return value


def _flag(name: str, value: Any) -> bool:
    if isinstance(value, str) and value.strip().lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        return value.strip().lower() in ("1", "true", "yes", "on")
    if not isinstance(value, bool):
        raise OptionsError(name, value, ["true", "false"])
    return value


# TORI_* environment variables, each naming one Options field.
ENVIRONMENT = {
    "TORI_TARGET": "target",
    "TORI_TARGETS": "targets",
    "TORI_CUDA_ARCH": "cuda_arch",
    "TORI_VULKAN_TARGET": "vulkan_target",
    "TORI_ROCM_CHIP": "rocm_chip",
    "TORI_FALLBACK": "fallback",
    "TORI_PARTITION": "partition",
    "TORI_RUNTIME_CHECKS": "runtime_checks",
    "TORI_DRIVER": "driver",
    "TORI_CPU": "cpu",
    "TORI_CODEGEN": "codegen",
    "TORI_RESIDENT_WEIGHTS": "resident_weights",
    "TORI_HUGE_PAGES": "huge_pages",
    "TORI_IREE_FLAGS": "iree_flags",
    "TORI_PIPELINE": "pipeline",
    "TORI_REPRO_DIR": "repro_dir",
    "TORI_DUMP_DIR": "dump_dir",
    "TORI_DUMP_IREE_PHASES": "dump_iree_phases",
    "TORI_DUMP_LARGE_CONSTANTS": "dump_large_constants",
    "TORI_REPORT": "report",
    "TORI_COMPILE_TIMEOUT": "compile_timeout_s",
    "TORI_SPECIALIZE_SHAPES": "specialize_shapes",
    "TORI_SPECIALIZE_AFTER": "specialize_after",
    "TORI_CACHE": "cache",
    "TORI_CACHE_DIR": "cache_dir",
    "TORI_CACHE_MAX_SIZE": "cache_max_bytes",
    "TORI_CACHE_URL": "cache_url",
    "TORI_CACHE_WAIT": "cache_wait_s",
}


# TORI_* variables read elsewhere: the shared cache's key, the log level; and the
# test suite's and fuzzer's own (TORI_REQUIRE_REDIS, TORI_FUZZ_SEED, ...).
OTHER_VARIABLES = ("TORI_CACHE_KEY", "TORI_LOG")
OTHER_PREFIXES = ("TORI_REQUIRE_", "TORI_FUZZ_")


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """A warning line for each TORI_* variable tori does not read (a misspelt one is
    otherwise ignored without a word), with the names it may have meant."""
    import difflib

    known = [*ENVIRONMENT, *OTHER_VARIABLES]
    lines = []
    for var in sorted(v for v in environ if v.startswith("TORI_") and v not in known
                      and not v.startswith(OTHER_PREFIXES)):
        close = difflib.get_close_matches(var, known, n=2, cutoff=0.8)
        lines.append(f"environment variable {var} is not one tori reads (ignored)"
                     + (f"; did you mean {' or '.join(close)}?" if close else
                        "; the README lists those it reads"))
    return lines


# Variables whose empty value means something (an empty pipeline runs no pass);
# any other variable set to "" counts as unset.
_EMPTY_MEANS_EMPTY = {"TORI_PIPELINE"}


def from_environment(environ: Mapping[str, str] | None = None) -> Options:
    environ = os.environ if environ is None else environ
    for line in unknown_variables(environ):
        warnings.warn(f"tori: {line}", stacklevel=2)
    values = {}
    for var, field_name in ENVIRONMENT.items():
        if not (environ.get(var) or (var in _EMPTY_MEANS_EMPTY and var in environ)):
            continue
        try:
            values[field_name] = _coerce(field_name, environ[var])
        except OptionsError as error:
            raise OptionsError(error.what, error.value, error.valid, message=(
                f"environment variable {var}={environ[var]!r}: {error.bare}; set it to a valid value "
                f"or unset it")) from None
    return Options(**values)


class Config:
    """tori's options as one module-level object, as `torch.compiler.config` is torch's.

    Starts from the TORI_* environment variables; every attribute is an Options field,
    validated when set; `patch(...)` changes some for a `with` block or a decorated
    function; `torch` is `torch.compiler.config`. Options passed to one
    `torch.compile(..., options={...})` apply over these.
    """

    def __init__(self) -> None:
        object.__setattr__(self, "_options", from_environment())

    def options(self) -> Options:
        return self._options

    def __getattr__(self, name: str) -> Any:
        if name in Options.names():
            return getattr(self._options, name)
        raise AttributeError(f"tori.compiler.config has no option {name!r}; options: {', '.join(Options.names())}")

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, "_options", Options.from_mapping({name: value}, base=self._options))

    def __dir__(self) -> list[str]:
        return [*Options.names(), "options", "patch", "reset", "torch"]

    def __repr__(self) -> str:
        return f"tori.compiler.config({', '.join(f'{n}={getattr(self, n)!r}' for n in Options.names())})"

    def patch(self, changes: Mapping[str, Any] | None = None, **more: Any) -> "_Patch":
        """Set options for a `with` block or a decorated function, then restore them."""
        return _Patch(self, {**(changes or {}), **more})

    def reset(self) -> None:
        """Back to the defaults and the TORI_* environment variables."""
        object.__setattr__(self, "_options", from_environment())

    @property
    def torch(self):
        import torch.compiler

        return torch.compiler.config


class _Patch(contextlib.ContextDecorator):
    def __init__(self, target: Config, changes: dict[str, Any]):
        Options.from_mapping(changes, base=target.options())  # fail at the patch, not at entry
        self._target = target
        self._changes = changes
        self._saved: list[Options] = []

    def __enter__(self) -> Config:
        self._saved.append(self._target.options())
        object.__setattr__(self._target, "_options", Options.from_mapping(self._changes, base=self._target.options()))
        return self._target

    def __exit__(self, *exc_info: Any) -> None:
        object.__setattr__(self._target, "_options", self._saved.pop())


config = Config()

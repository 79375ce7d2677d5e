"""Shape specialization of graphs with dynamic shapes: input sizes that recur get
their own static-shape compile, the dynamic module serves the other sizes.

IREE code compiled for dynamic shapes runs much slower than code compiled for fixed
ones (see docs/performance-notes.md), so with the option `specialize_shapes=N` a graph
whose AOT form has symbolic sizes is wrapped in a `ShapeVariants`:

- Every call looks up the sizes of the graph's dynamic inputs (the shapes of the
  tensors with a symbolic size, and the values of its SymInt/SymFloat arguments) in a
  dict of static variants; a hit runs the static module, a miss the dynamic one.
- Until N variants exist, misses are counted per size. The call on which a size is
  seen for the `specialize_after`-th time compiles its variant, synchronously, and is
  itself served by it. Compiling in the calling thread keeps PyTorch's tracing off
  other threads and makes "which call compiles" deterministic. The compile runs
  outside the lock, so other threads keep calling the dynamic module meanwhile, and
  one size is never compiled twice.
- A variant is the AOT graph with fake tensors of the seen sizes propagated through
  it (`static_graph`): every symbolic size becomes a constant. It keeps the graph's placeholders,
  so it is called exactly as the dynamic module is (same argument order, parameters
  at the same positions); SymInt arguments stay in the signature, unused. It goes
  through the same `compile_graph`, and its record is in the graph's record
  (`GraphRecord.variants`, each with its `sizes`).
- A variant that cannot be traced or compiled never fails the call: it is logged
  once, recorded, and the graph keeps its dynamic module (no further variants).
- Once N variants exist the per-call path is a dict lookup on the sizes.

Inference, forward and backward graphs are all specialized: a static forward returns
its saved sizes as Python ints, which the (dynamic or static) backward takes as it
takes SymInts.
"""

from __future__ import annotations

import copy
import logging
import threading
from typing import Any, Callable

import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from tori.config import Driver, Options
from tori.frontend.compile_graph import compile_graph
from tori.frontend.records import GraphRecord
from tori.stats import counters

log = logging.getLogger("tori.shape_variants")

_SYMBOLIC_SCALARS = (torch.SymInt, torch.SymFloat, torch.SymBool)

# Distinct sizes counted before the counts start over, so that a graph called with
# ever new sizes does not grow its table without bound.
MAX_COUNTED_SIZES = 1024


def dynamic_inputs(gm: torch.fx.GraphModule) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Positions of the inputs whose sizes vary: tensors with a symbolic size, and
    the symbolic scalars that those sizes do not already fix (a SymInt argument `s0`
    is skipped when some tensor input has a size of exactly `s0`). Both empty for a
    graph with static shapes."""
    tensors, scalars, sized = [], [], set()
    for position, node in enumerate(gm.graph.find_nodes(op="placeholder")):
        value = node.meta.get("val")
        if isinstance(value, torch.Tensor):
            symbolic = [size.node.expr for size in value.shape if isinstance(size, torch.SymInt)]
            if symbolic:
                tensors.append(position)
                sized.update(expr for expr in symbolic if expr.is_Symbol)
        elif isinstance(value, _SYMBOLIC_SCALARS):
            scalars.append((position, value.node.expr))
    free = tuple(position for position, expr in scalars if not expr.free_symbols <= sized)
    return tuple(tensors), free


def sizes_key(tensors: tuple[int, ...], scalars: tuple[int, ...]) -> Callable[[list], tuple]:
    """A function of a call's arguments that names the sizes a static variant fixes."""
    if not scalars and len(tensors) == 1:
        (only,) = tensors
        return lambda args: args[only].shape
    if not scalars:
        return lambda args: tuple([args[i].shape for i in tensors])
    if not tensors:
        return lambda args: tuple([args[i] for i in scalars])
    return lambda args: (tuple([args[i].shape for i in tensors]), tuple([args[i] for i in scalars]))


def specialize(dynamic, gm: torch.fx.GraphModule, options: Options, record: GraphRecord,
               static_args: frozenset[int]):
    """`dynamic` itself when the policy is off or the graph's shapes are static;
    otherwise a ShapeVariants that serves it and its static variants."""
    if options.specialize_shapes <= 0:
        return dynamic
    tensors, scalars = dynamic_inputs(gm)
    if not tensors and not scalars:
        return dynamic
    return ShapeVariants(dynamic, gm, options, record, static_args, tensors, scalars)


class ShapeVariants:
    """A compiled graph with dynamic shapes and at most `specialize_shapes` static
    variants of it, chosen per call by the sizes of its dynamic inputs."""

    _boxed_call = True

    def __init__(self, dynamic, gm: torch.fx.GraphModule, options: Options, record: GraphRecord,
                 static_args: frozenset[int], tensors: tuple[int, ...], scalars: tuple[int, ...]):
        self.dynamic = dynamic
        self.record = record
        self._gm = gm
        self._options = options
        self._static_args = static_args
        self._tensors = tensors
        self._scalars = scalars
        self._key = sizes_key(tensors, scalars)
        self._limit = options.specialize_shapes
        self._threshold = options.specialize_after
        # Read without the lock on every call; replaced (never mutated) under it.
        self._variants: dict[Any, Any] = {}
        self._counts: dict[Any, int] = {}
        self._compiling: set = set()
        self._lock = threading.Lock()
        self._open = True  # more variants may be compiled
        self._call = self._call_counting

    @property
    def variants(self) -> dict:
        """The static variants by the sizes they serve."""
        return dict(self._variants)

    def __call__(self, args):
        return self._call(args)

    def _call_settled(self, args):
        return self._variants.get(self._key(args), self.dynamic)(args)

    def _call_counting(self, args):
        key = self._key(args)
        variant = self._variants.get(key)
        if variant is not None:
            return variant(args)
        with self._lock:
            count = self._counts.get(key, 0) + 1
            if len(self._counts) >= MAX_COUNTED_SIZES and count == 1:
                self._counts.clear()
            self._counts[key] = count
            compile_now = (count >= self._threshold and key not in self._compiling
                           and self._open
                           and len(self._variants) + len(self._compiling) < self._limit)
            if compile_now:
                self._compiling.add(key)
        if compile_now:
            variant = self._compile(key, args)
            if variant is not None:
                return variant(args)
        return self.dynamic(args)

    def _compile(self, key, args):
        sizes = tuple(tuple(args[i].shape) for i in self._tensors) + tuple(args[i] for i in self._scalars)
        with self._lock:
            index = len(self.record.variants)
            variant_record = GraphRecord(name=f"{self.record.name}_static{index}", kind=self.record.kind, sizes=sizes)
            self.record.variants.append(variant_record)
        try:
            static_gm = static_graph(self._gm, args)
            compiled = compile_graph(static_gm, self._variant_options(), variant_record, self._static_args)
        except Exception as error:  # a variant only ever costs its compile: the call goes on
            variant_record.error = error
            log.warning("tori: no static variant of graph %s for sizes %s (%s: %s); its dynamic module "
                        "serves every size", self.record.name, variant_record.sizes, type(error).__name__,
                        str(error).splitlines()[0] if str(error) else "")
            with self._lock:
                self._compiling.discard(key)
                self._settle()
            return None
        with self._lock:
            counters.shape_variants += 1
            self._variants = {**self._variants, key: compiled}
            self._compiling.discard(key)
            self._counts.pop(key, None)
            if len(self._variants) >= self._limit:
                self._settle()
        return compiled

    def _settle(self) -> None:
        self._open = False
        self._counts.clear()
        self._call = self._call_settled

    def _variant_options(self) -> Options:
        # The dynamic module's measured driver serves the variant too: no second trial.
        driver = getattr(self.dynamic, "driver", None)
        if self._options.driver is Driver.AUTO and driver is not None:
            return self._options.replace(driver=Driver(driver))
        return self._options


def static_graph(gm: torch.fx.GraphModule, args: list) -> torch.fx.GraphModule:
    """A copy of `gm` with the sizes of `args`: every symbolic size is a constant.

    The scalar arguments' values replace their uses, fake tensors of the arguments'
    sizes are propagated through the copy (FakeTensorProp: no computation), and each
    node that now computes a plain number is replaced by it. The placeholders stay.
    This interprets the graph rather than re-tracing it with FX, whose process-wide
    "tracing" flag would make other threads' calls of Dynamo-compiled functions fail.
    """
    static = torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))
    graph = static.graph
    for node in graph.nodes:
        node.meta.pop("tensor_meta", None)  # symbolic, and the importer reads it before "val"
    for node, value in zip(graph.find_nodes(op="placeholder"), args):
        if not isinstance(value, torch.Tensor):
            node.meta["val"] = value
            _replace_uses(node, value)
    with torch.no_grad():
        FakeTensorProp(static, FakeTensorMode(allow_non_fake_inputs=True)).propagate(*args)
    for node in reversed(graph.nodes):
        if node.op == "call_function" and isinstance(node.meta.get("val"), (int, float, bool)):
            _replace_uses(node, node.meta["val"])
            graph.erase_node(node)
    static.recompile()
    return static


def _replace_uses(node: torch.fx.Node, value: Any) -> None:
    for user in list(node.users):
        user.args = torch.fx.node.map_arg(user.args, lambda arg: value if arg is node else arg)
        user.kwargs = torch.fx.node.map_arg(user.kwargs, lambda arg: value if arg is node else arg)

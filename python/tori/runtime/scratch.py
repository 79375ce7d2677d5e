"""Scratch memory for compiled calls: the buffer IREE keeps a call's intermediate
values in, owned by tori and reused call after call.

Left to itself, IREE allocates a module's intermediate values (its transients)
anew on every call and frees them after it. On the CPU that memory comes from the
C heap, which serves large blocks as fresh `mmap`s: the kernel zero-fills every page
on first touch, and a batch-8 ResNet-18's 116 MB cost 28,300 page faults per call.
A module compiled with `--iree-torch-externalize-transients` (for the CPU, modules
run in this process: targets/build.py) takes that memory as its last argument
instead; its size is a constant of the module or, where shapes are dynamic, what the
module's size function answers for the call's arguments. A pool per device (the two
host drivers share one) lends each call a buffer at least that large and takes it
back after the call.

Memory: a pool holds one buffer per call that ran at once (threads), each
as large as the largest request it served, until `tori.compiler.reset()`; that is the
peak a call needed anyway, now kept between calls.
"""

from __future__ import annotations

import re

import iree.runtime as rt

# Free buffers a pool keeps (one per thread that called at once); more are freed.
MAX_FREE_BUFFERS = 4
_MIN_BYTES = 64  # IREE allocates no empty buffer; a module without transients still takes one
# A VM function's calling convention as its repr shows it, "main(0rrI_r)": version 0,
# an argument type per character before "_" (IREE's Python API has no accessor for it).
_CALLING_CONVENTION = re.compile(r"\(0([a-zA-Z]*)_")


def arity(function: rt.VmFunction) -> int | None:
    """How many arguments `function` takes, None where its calling convention is not a plain list."""
    found = _CALLING_CONVENTION.search(repr(function))
    return len(found.group(1)) if found else None


class ScratchPool:
    """Scratch buffers of one device. `take` and `give` are safe across threads: a
    list's pop and append are atomic, and a buffer is in the list or in one call."""

    def __init__(self, device: rt.HalDevice):
        self._allocator = device.allocator
        self._free: list[tuple[int, rt.HalBuffer]] = []

    def take(self, size: int) -> tuple[int, rt.HalBuffer]:
        """A buffer of at least `size` bytes, as (its size, the buffer); a free buffer
        too small for it is freed."""
        try:
            lent = self._free.pop()
        except IndexError:
            return self._allocate(size)
        return lent if lent[0] >= size else self._allocate(size)

    def give(self, lent: tuple[int, rt.HalBuffer]) -> None:
        if len(self._free) < MAX_FREE_BUFFERS:
            self._free.append(lent)

    def held_bytes(self) -> int:
        """Bytes of the free buffers (what the pool holds between calls)."""
        return sum(size for size, _ in self._free)

    def _allocate(self, size: int) -> tuple[int, rt.HalBuffer]:
        size = max(int(size), _MIN_BYTES)
        return size, _allocate(self._allocator, size)


def _allocate(allocator: rt.HalAllocator, size: int) -> rt.HalBuffer:
    return allocator.allocate_buffer(memory_type=rt.MemoryType.DEVICE_LOCAL, allowed_usage=rt.BufferUsage.DEFAULT,
                                     allocation_size=size)


class ScratchAbi:
    """How one loaded module takes its scratch buffer: `size` bytes when the module
    states a constant, else `bytes_for(args)` asks its size function."""

    __slots__ = ("size", "_context", "_size_function", "_placeholder")

    def __init__(self, context: rt.VmContext, size: int | None, size_function: rt.VmFunction | None,
                 placeholder: rt.HalBuffer | None = None):
        self.size = size
        self._context = context
        self._size_function = size_function
        self._placeholder = placeholder

    @staticmethod
    def of(vm_module: rt.VmModule, context: rt.VmContext, function: str, device: rt.HalDevice) -> "ScratchAbi":
        """The scratch convention of `function`, which takes a scratch buffer."""
        asynchronous = vm_module.lookup_function(f"{function}$async")
        reflection = asynchronous.reflection if asynchronous is not None else {}
        if "iree.abi.transients.size" not in reflection:
            return ScratchAbi(context, 0, None)  # no intermediate values: it still takes a buffer
        constant = reflection.get("iree.abi.transients.size.constant")
        if constant is not None:
            return ScratchAbi(context, int(constant), None)
        return ScratchAbi(context, None, vm_module.lookup_function(reflection["iree.abi.transients.size"]),
                          _allocate(device.allocator, _MIN_BYTES))

    def bytes_for(self, sizing: rt.VmVariantList | None) -> int:
        """The scratch bytes of a call: the module's constant, else its size function's
        answer for `sizing`, a list of the call's arguments of its own (consumed)."""
        if self.size is not None:
            return self.size
        # The size function takes the asynchronous function's arguments: the call's,
        # a buffer (not read), and a wait and a signal fence (empty: nothing to wait for).
        sizing.push_ref(self._placeholder)
        sizing.push_ref(rt.HalFence(0))
        sizing.push_ref(rt.HalFence(0))
        answer = rt.VmVariantList(1)
        self._context.invoke(self._size_function, sizing, answer)
        return int(answer.get_variant(0))

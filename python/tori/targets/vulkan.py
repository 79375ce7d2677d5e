"""Vulkan device models: which `--iree-vulkan-target` the `vulkan_target` option
becomes (`host`: the Vulkan device of this machine), and the element types each computes wrongly.

Lavapipe (Mesa's CPU Vulkan) has its own IREE target, `llvmpipe`: 8/16-bit storage,
float16, subgroups of 8. IREE's portable baseline (`vp_android_baseline_2022`) has
32-bit storage only, so IREE stores 8-bit values (bools included) with atomic and/or
on 32-bit words, then reads them back with a plain load; lavapipe (Mesa 22.3) returns
stale words for such loads, so reductions over bools come out wrong there
(docs/targets.md: the reproducer).
"""

from __future__ import annotations

import logging
from functools import lru_cache

log = logging.getLogger("tori.targets.vulkan")

HOST = "host"
BASELINE = "vp_android_baseline_2022"
LAVAPIPE = "llvmpipe"

# Element types (torch dialect spelling) each device model computes wrongly or not at all in IREE 3.13.
_UNSUPPORTED = {
    BASELINE: ("bf16", "f16", "f64"),
    LAVAPIPE: ("bf16", "f64"),
}
# Types whose tensors the baseline stores as bytes packed into 32-bit words (above).
_PACKED_BYTES = ("i1", "si8", "ui8")


@lru_cache(maxsize=1)
def host_devices() -> tuple[str, ...]:
    """The names of the Vulkan devices IREE's runtime finds here ("llvmpipe (LLVM 15.0.6, 256 bits)"), or ()."""
    from tori.errors import ToriRuntimeError
    from tori.runtime import devices

    try:
        return tuple(d.get("name", "") for d in devices.available_devices("vulkan"))
    except ToriRuntimeError:
        return ()


def on_lavapipe() -> bool:
    found = host_devices()
    return bool(found) and found[0].startswith("llvmpipe")


def resolve(arch: str) -> str:
    """The IREE Vulkan target for the `vulkan_target` option: `host` is lavapipe's own
    target when this machine's Vulkan device is lavapipe, else the portable baseline."""
    if arch != HOST:
        return arch
    resolved = LAVAPIPE if on_lavapipe() else BASELINE
    log.debug("vulkan_target 'host' is %s (Vulkan devices here: %s)", resolved, host_devices() or "none")
    return resolved


def unsupported_types(arch: str) -> tuple[str, ...]:
    """Element types refused for `arch` (the graph falls back to eager rather than answer wrongly)."""
    arch = resolve(arch)
    refused = _UNSUPPORTED.get(arch, _UNSUPPORTED[BASELINE])
    if arch == BASELINE and on_lavapipe():
        refused += _PACKED_BYTES
    return refused

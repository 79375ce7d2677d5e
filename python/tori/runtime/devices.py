"""IREE runtime instances and devices, created once per driver and shared."""

from __future__ import annotations

import atexit
import threading

import iree.runtime as rt

from tori.errors import ToriRuntimeError
from tori.runtime.scratch import ScratchPool

_lock = threading.Lock()
_instance: rt.VmInstance | None = None
_devices: dict[str, rt.HalDevice] = {}
_scratch: dict[str | int, ScratchPool] = {}  # "host", or a device's id: runtime/scratch.py


def vm_instance() -> rt.VmInstance:
    global _instance
    with _lock:
        if _instance is None:
            _instance = rt.VmInstance()
        return _instance


def available_drivers() -> list[str]:
    """The runtime drivers this IREE build has (`iree.runtime.query_available_drivers()`)."""
    return list(rt.query_available_drivers())


def available_devices(driver: str) -> list[dict]:
    """The devices `driver` finds on this machine; raises ToriRuntimeError when the
    driver is missing from this build or cannot start (no CUDA/HIP library, no Vulkan loader)."""
    drivers = available_drivers()
    if driver not in drivers:
        raise ToriRuntimeError(f"IREE driver '{driver}' is not in this IREE runtime build; drivers in it: {', '.join(drivers)}")
    try:
        return list(rt.get_driver(driver).query_available_devices())
    except Exception as error:
        raise ToriRuntimeError(f"IREE driver '{driver}' cannot start here: {_first_line(error)}. "
                               f"Drivers in this build: {', '.join(drivers)}; {_describe_devices()}") from error


def device(driver: str, index: int | None = None) -> rt.HalDevice:
    """The device of `driver` (its `index`-th device, or its default one), created once.

    Whether a device exists is asked before one is created, so that a machine
    without one gets a ToriRuntimeError naming what it has, not an abort.
    """
    key = driver if index is None else f"{driver}:{index}"
    with _lock:
        found = _devices.get(key)
        if found is not None:
            return found
        found_devices = available_devices(driver) if driver not in _LOCAL_DRIVERS else [{}]
        if not found_devices:
            raise ToriRuntimeError(f"IREE driver '{driver}' finds no device on this machine; {_describe_devices()}")
        if index is not None and index >= len(found_devices):
            raise ToriRuntimeError(f"IREE driver '{driver}' has no device {index}; it finds {len(found_devices)}: "
                                   f"{', '.join(d.get('name', '?') for d in found_devices)}")
        try:
            iree_driver = rt.get_driver(driver)
            if index is None:
                found = iree_driver.create_default_device()
            else:
                found = iree_driver.create_device(found_devices[index]["device_id"])
        except Exception as error:
            raise ToriRuntimeError(
                f"IREE driver '{driver}' could not create a device: {_first_line(error)}. {_describe_devices()}"
            ) from error
        _devices[key] = found
        return found


_LOCAL_DRIVERS = ("local-sync", "local-task")


def scratch_pool(driver: str, found: rt.HalDevice) -> ScratchPool:
    """The scratch buffers of `found`, a device of `driver` (runtime/scratch.py), created
    once. The host drivers share one pool: a buffer of one serves modules on the other,
    so a graph timed on both (driver="auto") does not keep two."""
    key = "host" if driver in _LOCAL_DRIVERS else id(found)
    with _lock:
        pool = _scratch.get(key)
        if pool is None:
            pool = _scratch[key] = ScratchPool(found)
        return pool


def _first_line(error: Exception) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def _describe_devices() -> str:
    """What this machine has: each driver of the build with the devices it finds."""
    parts = []
    for driver in available_drivers():
        if driver in _LOCAL_DRIVERS:
            parts.append(f"{driver} (host CPU)")
            continue
        try:
            names = [d.get("name", "?") for d in rt.get_driver(driver).query_available_devices()]
            parts.append(f"{driver} ({', '.join(names) if names else 'no device'})")
        except Exception:
            parts.append(f"{driver} (unavailable)")
    return "drivers and devices here: " + "; ".join(parts)


def release_all() -> None:
    """Drop every cached device, its scratch buffers and the VM instance (modules using
    them must be gone)."""
    global _instance
    with _lock:
        _scratch.clear()
        _devices.clear()
        _instance = None


def _at_exit() -> None:
    # Dynamo's code caches can keep compiled modules alive until interpreter
    # teardown, which nanobind would report as leaks; they are freed by the OS.
    from iree.runtime import _binding

    _binding.disable_leak_checker()


atexit.register(_at_exit)

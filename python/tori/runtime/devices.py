"""IREE runtime instances and devices, created once per driver and shared."""

from __future__ import annotations

import atexit
import threading

import iree.runtime as rt

from tori.errors import ToriRuntimeError

_lock = threading.Lock()
_instance: rt.VmInstance | None = None
_devices: dict[str, rt.HalDevice] = {}


def vm_instance() -> rt.VmInstance:
    global _instance
    with _lock:
        if _instance is None:
            _instance = rt.VmInstance()
        return _instance


def device(driver: str) -> rt.HalDevice:
    with _lock:
        found = _devices.get(driver)
        if found is None:
            try:
                found = rt.get_driver(driver).create_default_device()
            except Exception as error:
                available = ", ".join(rt.query_available_drivers())
                raise ToriRuntimeError(
                    f"IREE driver '{driver}' could not create a device: {error}. Drivers in this build: {available}"
                ) from error
            _devices[driver] = found
        return found


def release_all() -> None:
    """Drop every cached device and the VM instance (modules using them must be gone)."""
    global _instance
    with _lock:
        _devices.clear()
        _instance = None


def _at_exit() -> None:
    # Dynamo's code caches can keep compiled modules alive until interpreter
    # teardown, which nanobind would report as leaks; they are freed by the OS.
    from iree.runtime import _binding

    _binding.disable_leak_checker()


atexit.register(_at_exit)

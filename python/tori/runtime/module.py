"""A vmfb loaded into an IREE VM context on one device, ready to invoke."""

from __future__ import annotations

import iree.runtime as rt

from tori.errors import ToriRuntimeError
from tori.runtime.devices import device, vm_instance


class LoadedModule:
    """One vmfb in one VM context; `invoke` runs an exported function on raw VM lists."""

    __slots__ = ("driver", "device", "_context", "_function", "_vm_module")

    def __init__(self, vmfb: bytes, driver: str, function: str = "main", device_index: int | None = None,
                 parameters: rt.ParameterIndex | None = None, scope: str = ""):
        """`parameters`: the values of the module's parameter globals (in `scope`), read
        by its initializers as the context is created."""
        self.driver = driver
        self.device = device(driver, device_index)
        instance = vm_instance()
        try:
            modules = [rt.create_hal_module(instance, self.device)]
            if parameters is not None:
                modules.append(rt.create_io_parameters_module(instance, parameters.create_provider(scope=scope)))
            self._vm_module = rt.VmModule.copy_buffer(instance, vmfb)
            self._context = rt.VmContext(instance, [*modules, self._vm_module])
        except Exception as error:
            raise ToriRuntimeError(f"could not load the compiled module on '{driver}': {error}") from error
        self._function = self._vm_module.lookup_function(function)
        if self._function is None:
            names = ", ".join(self._vm_module.function_names)
            raise ToriRuntimeError(f"the module has no function '{function}'; it exports: {names}")

    def invoke(self, args: rt.VmVariantList, num_results: int) -> rt.VmVariantList:
        results = rt.VmVariantList(num_results)
        self._context.invoke(self._function, args, results)
        return results

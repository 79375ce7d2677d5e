"""A vmfb loaded into an IREE VM context on one device, ready to invoke."""

from __future__ import annotations

import iree.runtime as rt

from tori.errors import ToriRuntimeError
from tori.runtime.devices import device, scratch_pool, vm_instance
from tori.runtime.scratch import ScratchAbi, arity


class LoadedModule:
    """One vmfb in one VM context; `invoke` runs an exported function on raw VM lists.

    `scratch` is how the function takes its scratch buffer (runtime/scratch.py), None
    when it allocates its own; `invoke` then lends it one from the device's pool."""

    __slots__ = ("driver", "device", "scratch", "_context", "_function", "_vm_module", "_pool")

    def __init__(self, vmfb: bytes, driver: str, function: str = "main", device_index: int | None = None,
                 parameters: rt.ParameterIndex | None = None, scope: str = "", arguments: int | None = None):
        """`parameters`: the values of the module's parameter globals (in `scope`), read
        by its initializers as the context is created; `arguments`: how many the caller
        passes, the function taking one more where it takes a scratch buffer
        (targets/build.in_process_flags; a module whose transients' sizes depend on values
        is compiled without)."""
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
        takes_scratch = arguments is not None and arity(self._function) == arguments + 1
        self.scratch = ScratchAbi.of(self._vm_module, self._context, function, self.device) if takes_scratch else None
        self._pool = scratch_pool(driver, self.device) if self.scratch is not None else None

    def invoke(self, args: rt.VmVariantList, num_results: int,
               sizing: rt.VmVariantList | None = None) -> rt.VmVariantList:
        """Run the function on `args` (its arguments before the scratch buffer, if it takes
        one); `sizing`, a second list of the same arguments, where the scratch size is not
        a constant (`scratch.size` None)."""
        results = rt.VmVariantList(num_results)
        if self.scratch is None:
            self._context.invoke(self._function, args, results)
            return results
        lent = self._pool.take(self.scratch.bytes_for(sizing))
        args.push_ref(lent[1])
        try:
            self._context.invoke(self._function, args, results)
        finally:
            self._pool.give(lent)
        return results

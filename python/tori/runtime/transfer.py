"""Explicit host <-> device copies for devices that cannot read torch's CPU memory
in place (Vulkan): inputs are copied into device buffers, results are copied into
a host staging buffer by the device queue and read from there.

IREE's own `DeviceArray.to_host()` imports the destination host memory, which a
Vulkan driver refuses unless it is aligned to minImportedHostPointerAlignment
(4096 bytes on lavapipe); a staging buffer the driver allocates itself has no
such constraint.
"""

from __future__ import annotations

from functools import lru_cache

import iree.runtime as rt
import numpy as np
import torch
from torch.utils.dlpack import to_dlpack

_DEVICE_MEMORY = rt.MemoryType.DEVICE_LOCAL
_STAGING_MEMORY = int(rt.MemoryType.HOST_LOCAL | rt.MemoryType.DEVICE_VISIBLE)
_STAGING_USAGE = int(rt.BufferUsage.TRANSFER_TARGET | rt.BufferUsage.MAPPING)
_BYTE = np.dtype(np.uint8)


@lru_cache(maxsize=None)
def element_type(dtype: torch.dtype) -> int:
    """IREE's element type for a torch dtype: as IREE itself reads it from DLPack."""
    from tori.runtime.devices import device

    return device("local-sync").from_dlpack_capsule(to_dlpack(torch.zeros(1, dtype=dtype))).element_type


def upload(device: rt.HalDevice, tensor: torch.Tensor) -> rt.HalBufferView:
    """A device buffer holding a copy of the CPU tensor `tensor`."""
    tensor = tensor.detach()
    if tensor.is_conj():
        tensor = tensor.resolve_conj()
    if not tensor.is_contiguous():
        tensor = tensor.contiguous()
    # Bytes, so that dtypes numpy lacks (bfloat16) and 0-d tensors copy alike.
    raw = tensor.reshape(-1).view(torch.uint8).numpy() if tensor.numel() else np.zeros(0, dtype=np.uint8)
    buffer = device.allocator.allocate_buffer_copy(
        memory_type=_DEVICE_MEMORY, allowed_usage=rt.BufferUsage.DEFAULT, device=device, buffer=raw)
    return rt.HalBufferView(buffer, list(tensor.shape), element_type(tensor.dtype))


def download(device: rt.HalDevice, view: rt.HalBufferView, dtype: torch.dtype) -> torch.Tensor:
    """The device buffer `view` copied into a new CPU tensor of `dtype`."""
    shape = list(view.shape)
    source = view.get_buffer()
    size = view.byte_length
    if size == 0:
        return torch.empty(shape, dtype=dtype)
    staging = device.allocator.allocate_buffer(
        memory_type=_STAGING_MEMORY, allowed_usage=_STAGING_USAGE, allocation_size=size)
    semaphore = device.create_semaphore(0)
    device.queue_copy(source_buffer=source, target_buffer=staging,
                      wait_semaphores=rt.HalFence.create_at(semaphore, 0),
                      signal_semaphores=rt.HalFence.create_at(semaphore, 1))
    rt.HalFence.create_at(semaphore, 1).wait()
    data = torch.from_numpy(staging.map().asarray([size], _BYTE).copy())
    count = max(1, int(np.prod(shape)))
    width = size // count
    if width == dtype.itemsize:
        return data.view(dtype).reshape(shape)
    # A narrower or wider storage type than torch's (IREE's signless integers, i1):
    # read it as the integer of its width, then convert.
    stored = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[width]
    return data.view(stored).reshape(shape).to(dtype)

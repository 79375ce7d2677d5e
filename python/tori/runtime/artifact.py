"""Exported artifacts (tori.export) at run time: read and check a manifest, load the
module of one target with its parameter archive, and call its entry points with numpy
arrays. Needs only IREE's runtime and numpy: nothing here imports PyTorch.

The artifact format is described in docs/export.md; this module owns its constants
and its integrity check, which the exporter (tori.aot) writes with.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from tori.errors import ArtifactError

log = logging.getLogger("tori.runtime")

FORMAT = "tori-artifact"
# Raised whenever an older reader could not run a newer artifact correctly. Version 2:
# an entry point may take a seed for its random ops (its `seed` field). Version 3: an
# input or output may be complex. Artifacts are written with the lowest version that
# describes them.
FORMAT_VERSION = 3
MANIFEST = "manifest.json"
PARAMETER_SCOPE = "model"

# The manifest's dtype names (torch's spelling) and their numpy dtypes.
NUMPY_DTYPES: dict[str, np.dtype] = {
    "float64": np.dtype(np.float64), "float32": np.dtype(np.float32), "float16": np.dtype(np.float16),
    "int64": np.dtype(np.int64), "int32": np.dtype(np.int32), "int16": np.dtype(np.int16),
    "int8": np.dtype(np.int8), "uint8": np.dtype(np.uint8), "bool": np.dtype(np.bool_),
    "complex64": np.dtype(np.complex64), "complex128": np.dtype(np.complex128),
}
_INTEGER_OF_WIDTH = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}
_FLOAT_OF_WIDTH = {2: np.float16, 4: np.float32, 8: np.float64}

# Fields every manifest has; `check_manifest` names the first one missing.
REQUIRED_FIELDS = ("format", "format_version", "entry_points", "targets", "files", "content_hash")


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def content_hash(manifest: Mapping[str, Any]) -> str:
    """sha256 over every field of the manifest but `content_hash` itself; the files
    are covered through their sha256 in `files`."""
    fields = {k: v for k, v in manifest.items() if k != "content_hash"}
    return "sha256:" + hashlib.sha256(json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def describe_files(folder: Path, names: Sequence[str]) -> dict[str, dict[str, Any]]:
    return {name: {"sha256": file_sha256(folder / name), "bytes": (folder / name).stat().st_size} for name in names}


def write_manifest(folder: Path, manifest: dict[str, Any]) -> None:
    manifest["content_hash"] = content_hash(manifest)
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=False) + "\n")


def read_manifest(folder: Path | str, *, verify_files: bool = True) -> dict[str, Any]:
    """The manifest of the artifact in `folder`, checked: format and version, required
    fields, each file's presence and sha256, and the content hash."""
    folder = Path(folder)
    path = folder / MANIFEST
    if not folder.is_dir():
        raise ArtifactError("no artifact folder here (tori.export writes one)", path=folder)
    if not path.is_file():
        raise ArtifactError("missing: the folder is not a complete tori artifact", path=path)
    try:
        manifest = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ArtifactError(f"not valid JSON ({error})", path=path) from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ArtifactError(f"not a tori artifact manifest (expected {FORMAT!r})", path=path, field="format")
    version = manifest.get("format_version")
    if not isinstance(version, int):
        raise ArtifactError(f"must be an integer, found {version!r}", path=path, field="format_version")
    if version > FORMAT_VERSION:
        raise ArtifactError(
            f"the artifact has format version {version}, newer than this tori reads ({FORMAT_VERSION}); "
            f"it was written by tori {manifest.get('versions', {}).get('tori', '?')}: upgrade tori to run it",
            path=path, field="format_version")
    for name in REQUIRED_FIELDS:
        if name not in manifest:
            raise ArtifactError("missing", path=path, field=name)
    if verify_files:
        for name, info in manifest["files"].items():
            file = folder / name
            if not file.is_file():
                raise ArtifactError(f"listed in the manifest but missing from {folder}", path=file,
                                    field=f"files.{name}")
            size = file.stat().st_size
            if size != info.get("bytes"):
                raise ArtifactError(f"has {size} bytes, the manifest says {info.get('bytes')} (truncated or replaced?)",
                                    path=file, field=f"files.{name}.bytes")
            if file_sha256(file) != info.get("sha256"):
                raise ArtifactError("its sha256 differs from the manifest's (corrupted or replaced?)",
                                    path=file, field=f"files.{name}.sha256")
    if content_hash(manifest) != manifest["content_hash"]:
        raise ArtifactError("does not match the manifest's contents: the manifest was edited after export",
                            path=path, field="content_hash")
    return manifest


# ---------------------------------------------------------------------------
# Devices


def _target_and_driver(manifest: Mapping[str, Any], device: str, path: Path) -> tuple[str, str]:
    """The manifest's target for `device` (a target name, or an IREE driver name) and the driver."""
    targets = manifest["targets"]
    if device in targets:
        return device, targets[device]["drivers"][0]
    for target, info in targets.items():
        if device in info["drivers"]:
            return target, device
    exported = "; ".join(f"{t} (drivers {', '.join(i['drivers'])})" for t, i in targets.items())
    raise ArtifactError(f"has no module for device {device!r}; it was exported for: {exported}",
                        path=path / MANIFEST, field="targets")


@dataclass(frozen=True)
class _Transfer:
    """Host <-> device copies with numpy arrays. Results are read through a staging
    buffer that the device allocates itself, which every driver allows (Vulkan
    refuses to import host memory that is not page-aligned)."""

    device: Any

    def upload(self, array: np.ndarray, element_type: int):
        import iree.runtime as rt

        raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8) if array.size else np.zeros(0, np.uint8)
        buffer = self.device.allocator.allocate_buffer_copy(
            memory_type=rt.MemoryType.DEVICE_LOCAL, allowed_usage=rt.BufferUsage.DEFAULT, device=self.device,
            buffer=raw)
        return rt.HalBufferView(buffer, list(array.shape), element_type)

    def download(self, view, dtype: np.dtype) -> np.ndarray:
        import iree.runtime as rt

        shape = tuple(view.shape)
        size = view.byte_length
        if size == 0:
            return np.zeros(shape, dtype)
        staging = self.device.allocator.allocate_buffer(
            memory_type=int(rt.MemoryType.HOST_LOCAL | rt.MemoryType.DEVICE_VISIBLE),
            allowed_usage=int(rt.BufferUsage.TRANSFER_TARGET | rt.BufferUsage.MAPPING), allocation_size=size)
        semaphore = self.device.create_semaphore(0)
        self.device.queue_copy(source_buffer=view.get_buffer(), target_buffer=staging,
                               wait_semaphores=rt.HalFence.create_at(semaphore, 0),
                               signal_semaphores=rt.HalFence.create_at(semaphore, 1))
        rt.HalFence.create_at(semaphore, 1).wait()
        data = staging.map().asarray([size], np.dtype(np.uint8)).copy()
        width = size // max(1, int(np.prod(shape)))
        if width == dtype.itemsize:
            return data.view(dtype).reshape(shape)
        # The device stored another width (float64 demoted on Vulkan, IREE's i8 booleans).
        stored = (_FLOAT_OF_WIDTH if dtype.kind == "f" else _INTEGER_OF_WIDTH)[width]
        return data.view(stored).reshape(shape).astype(dtype)


def _element_type(dtype: np.dtype) -> int:
    import iree.runtime as rt

    table = {
        "float64": rt.HalElementType.FLOAT_64, "float32": rt.HalElementType.FLOAT_32,
        "float16": rt.HalElementType.FLOAT_16, "int64": rt.HalElementType.SINT_64,
        "int32": rt.HalElementType.SINT_32, "int16": rt.HalElementType.SINT_16, "int8": rt.HalElementType.SINT_8,
        "uint8": rt.HalElementType.UINT_8, "bool": rt.HalElementType.BOOL_8,
        "complex64": rt.HalElementType.COMPLEX_64, "complex128": rt.HalElementType.COMPLEX_128,
    }
    return int(table[np.dtype(dtype).name])


# ---------------------------------------------------------------------------
# Loading and calling


class EntryPoint:
    """One function of an artifact: numpy arrays in (checked against the manifest), numpy arrays out."""

    def __init__(self, artifact: "Artifact", name: str, spec: Mapping[str, Any]):
        self.name = name
        self.spec = spec
        self._artifact = artifact
        self._function = artifact._vm_module.lookup_function(spec["function"])
        if self._function is None:
            raise ArtifactError(
                f"names function {spec['function']!r}, which the module does not export "
                f"(it exports {', '.join(artifact._vm_module.function_names)})",
                path=artifact.path / MANIFEST, field=f"entry_points.{name}.function")
        self.input_names = tuple(i["name"] for i in spec["inputs"])
        self.output_names = tuple(o["name"] for o in spec["outputs"])
        self.seeded = "seed" in spec  # random ops: an int64 seed follows the inputs

    def __repr__(self) -> str:
        inputs = ", ".join(f"{i['name']}: {i['dtype']}{i['shape']}" for i in self.spec["inputs"])
        return f"<tori entry point {self.name}({inputs})>"

    def check_inputs(self, inputs: Sequence[Any]) -> list[np.ndarray]:
        """The inputs as numpy arrays, or an ArtifactError naming the input and field that do not match."""
        specs = self.spec["inputs"]
        field = f"entry_points.{self.name}.inputs"
        where = self._artifact.path / MANIFEST
        if len(inputs) != len(specs):
            raise ArtifactError(f"entry point '{self.name}' takes {len(specs)} input(s) "
                                f"({', '.join(self.input_names)}), got {len(inputs)}", path=where, field=field)
        arrays = []
        bound: dict[str, tuple[int, str]] = {}
        symbols = self._artifact.manifest.get("symbols", {})
        for index, (value, spec) in enumerate(zip(inputs, specs)):
            name = f"{field}[{index}] ({spec['name']})"
            array = np.asarray(value)
            expected = NUMPY_DTYPES[spec["dtype"]]
            if array.dtype != expected:
                raise ArtifactError(f"input '{spec['name']}' must be {spec['dtype']}, got {array.dtype.name}",
                                    path=where, field=f"{name}.dtype")
            shape = spec["shape"]
            if array.ndim != len(shape):
                raise ArtifactError(f"input '{spec['name']}' must have rank {len(shape)} (shape {shape}), got "
                                    f"rank {array.ndim} (shape {list(array.shape)})", path=where, field=f"{name}.shape")
            for axis, (size, dim) in enumerate(zip(array.shape, shape)):
                if isinstance(dim, int):
                    if size != dim:
                        raise ArtifactError(f"input '{spec['name']}' dimension {axis} must be {dim}, got {size} "
                                            f"(shape {list(array.shape)})", path=where, field=f"{name}.shape[{axis}]")
                    continue
                low, high = symbols.get(dim, {}).get("min"), symbols.get(dim, {}).get("max")
                if (low is not None and size < low) or (high is not None and size > high):
                    raise ArtifactError(f"input '{spec['name']}' dimension {axis} ({dim}) must be in "
                                        f"[{low}, {high}], got {size}", path=where, field=f"symbols.{dim}")
                if dim in bound and bound[dim][0] != size:
                    raise ArtifactError(f"input '{spec['name']}' dimension {axis} is {dim}, which is {bound[dim][0]} "
                                        f"in {bound[dim][1]}; got {size}", path=where, field=f"{name}.shape[{axis}]")
                bound.setdefault(dim, (size, spec["name"]))
            arrays.append(array)
        return arrays

    def dlpack(self, *tensors: Any):
        """Run the entry point on tensors already in the device's memory, exchanged by
        DLPack (CUDA torch tensors for a cuda artifact, CPU ones for cpu): no copies;
        the results are `DLPackResult`s (`torch.from_dlpack(result)`)."""
        return _dlpack_call(self, tensors)

    def __call__(self, *inputs: Any, seed: int | None = None):
        """Run the entry point. One with random ops takes `seed`, by default a fresh draw
        from the artifact's generator (`Artifact.manual_seed`): the same seed, the same results."""
        import iree.runtime as rt

        arrays = self.check_inputs(inputs)
        artifact = self._artifact
        transfer = artifact._transfer
        arguments = rt.VmVariantList(len(arrays) + self.seeded)
        for array in arrays:
            if array.dtype == np.float64 and not artifact.float64:
                array = array.astype(np.float32)
            arguments.push_ref(transfer.upload(array, _element_type(array.dtype)))
        if self.seeded:
            value = np.array(artifact._seeds.integers(0, 2**63 - 1) if seed is None else seed, dtype=np.int64)
            arguments.push_ref(transfer.upload(value, _element_type(value.dtype)))
        outputs = self.spec["outputs"]
        results = rt.VmVariantList(len(outputs))
        try:
            artifact._context.invoke(self._function, arguments, results)
        except (RuntimeError, ValueError) as error:
            raise ArtifactError(f"entry point '{self.name}' failed on IREE's {artifact.driver} driver: {error}",
                                path=artifact.path) from error
        values = tuple(transfer.download(results.get_as_object(i, rt.HalBufferView), NUMPY_DTYPES[o["dtype"]])
                       for i, o in enumerate(outputs))
        return values[0] if len(values) == 1 else values


# DLPack's device type codes of the targets whose memory DLPack consumers (torch, CuPy,
# JAX) exchange with IREE: host memory, CUDA, ROCm.
DLPACK_DEVICES = {"cpu": 1, "cuda": 2, "rocm": 10}


class DLPackResult:
    """A result of `EntryPoint.dlpack`, in the artifact's device memory: hand it to any
    DLPack consumer (`torch.from_dlpack(result)`), which then owns it without a copy."""

    def __init__(self, device: Any, view: Any, dl_device: tuple[int, int]):
        self._device, self._view, self._dl_device = device, view, dl_device
        self.shape = tuple(view.shape)

    def __dlpack__(self, stream: Any = None, **_: Any):
        return self._device.create_dlpack_capsule(self._view, *self._dl_device)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._dl_device


def _dlpack_call(entry: "EntryPoint", tensors: Sequence[Any]) -> Any:
    """Run `entry` on tensors in the device's own memory (objects with `__dlpack__`, such
    as CUDA torch tensors for a cuda artifact), without copies either way."""
    import iree.runtime as rt

    artifact = entry._artifact
    dl_type = DLPACK_DEVICES.get(artifact.target)
    if dl_type is None:
        raise ArtifactError(f"DLPack exchange needs a cpu, cuda or rocm module; this artifact runs {artifact.target}",
                            path=artifact.path)
    specs = entry.spec["inputs"]
    if len(tensors) != len(specs) or entry.seeded:
        raise ArtifactError(f"entry point '{entry.name}' takes {len(specs)} tensor(s) by DLPack, got {len(tensors)}"
                            + (" (entry points with random ops take numpy inputs)" if entry.seeded else ""),
                            path=artifact.path / MANIFEST, field=f"entry_points.{entry.name}.inputs")
    arguments = rt.VmVariantList(len(specs))
    for tensor, spec in zip(tensors, specs):
        if not hasattr(tensor, "__dlpack__"):
            raise ArtifactError(f"input '{spec['name']}' is a {type(tensor).__name__}, which has no __dlpack__",
                                path=artifact.path / MANIFEST, field=f"entry_points.{entry.name}.inputs")
        try:
            view = artifact.device.from_dlpack_capsule(tensor.__dlpack__())
        except (IndexError, RuntimeError, ValueError) as error:
            raise ArtifactError(f"input '{spec['name']}' cannot be imported by DLPack on {artifact.driver}: {error} "
                                f"(IREE imports host memory aligned to 64 bytes: copy the tensor into memory of its "
                                f"own, e.g. tensor.clone())", path=artifact.path / MANIFEST,
                                field=f"entry_points.{entry.name}.inputs") from error
        wanted = _element_type(NUMPY_DTYPES[spec["dtype"]])
        fixed = [d for d in spec["shape"]]
        if view.element_type != wanted or len(view.shape) != len(fixed) or any(
                isinstance(d, int) and d != size for d, size in zip(fixed, view.shape)):
            raise ArtifactError(f"input '{spec['name']}' must be {spec['dtype']} of shape {fixed}, got element type "
                                f"{view.element_type} of shape {list(view.shape)}", path=artifact.path / MANIFEST,
                                field=f"entry_points.{entry.name}.inputs")
        arguments.push_ref(view)
    results = rt.VmVariantList(len(entry.spec["outputs"]))
    try:
        artifact._context.invoke(entry._function, arguments, results)
    except (RuntimeError, ValueError) as error:
        raise ArtifactError(f"entry point '{entry.name}' failed on IREE's {artifact.driver} driver: {error}",
                            path=artifact.path) from error
    values = tuple(DLPackResult(artifact.device, results.get_as_object(i, rt.HalBufferView), (dl_type, 0))
                   for i in range(len(entry.spec["outputs"])))
    return values[0] if len(values) == 1 else values


class Artifact:
    """An exported artifact loaded on one device; call an entry point as
    `artifact(x)` (the only or the `forward` one), `artifact.decode(x)` or `artifact["decode"](x)`."""

    def __init__(self, path: Path | str, device: str = "cpu"):
        import iree.runtime as rt

        from tori.runtime.devices import device as iree_device, vm_instance

        start = time.perf_counter()
        self.path = Path(path)
        self.manifest = read_manifest(self.path)
        self._seeds = np.random.default_rng()  # the seeds of entry points with random ops
        self.target, self.driver = _target_and_driver(self.manifest, device, self.path)
        target = self.manifest["targets"][self.target]
        self.float64 = target.get("float64", True)
        self.device = iree_device(self.driver)
        self._transfer = _Transfer(self.device)
        instance = vm_instance()
        modules = []
        parameters = self.manifest.get("parameters")
        if parameters:
            index = rt.ParameterIndex()
            index.load(str(self.path / parameters["file"]))
            modules.append(rt.create_io_parameters_module(instance, index.create_provider(scope=parameters["scope"])))
        vmfb = self.path / target["file"]
        try:
            self._vm_module = rt.VmModule.copy_buffer(instance, vmfb.read_bytes())
            modules.insert(0, rt.create_hal_module(instance, self.device))
            self._context = rt.VmContext(instance, [*modules, self._vm_module])
        except Exception as error:
            raise ArtifactError(f"IREE could not load it on '{self.driver}': {error}", path=vmfb,
                                field=f"targets.{self.target}.file") from error
        self.entry_points = {name: EntryPoint(self, name, spec)
                             for name, spec in self.manifest["entry_points"].items()}
        log.info("loaded %s (%s, %s) on %s in %.2f s", self.path, self.target, ", ".join(self.entry_points),
                 self.driver, time.perf_counter() - start)

    def __repr__(self) -> str:
        return f"<tori artifact {self.path} on {self.driver}: {', '.join(self.entry_points)}>"

    def manual_seed(self, seed: int) -> None:
        """Seed the generator that draws the seeds of entry points with random ops."""
        self._seeds = np.random.default_rng(seed)

    def __getitem__(self, name: str) -> EntryPoint:
        try:
            return self.entry_points[name]
        except KeyError:
            raise ArtifactError(f"has no entry point {name!r}; it has: {', '.join(self.entry_points)}",
                                path=self.path / MANIFEST, field="entry_points") from None

    def __getattr__(self, name: str) -> EntryPoint:
        entries = self.__dict__.get("entry_points", {})
        if name in entries:
            return entries[name]
        if name.startswith("_") or not entries:
            raise AttributeError(name)
        raise AttributeError(f"the tori artifact {self.path} has no entry point {name!r}; it has: "
                             f"{', '.join(entries)} (call artifact.{next(iter(entries))}(...) or artifact[name])")

    def __call__(self, *inputs: Any):
        names = list(self.entry_points)
        name = names[0] if len(names) == 1 else "forward"
        return self[name](*inputs)


def load(path: Path | str, device: str = "cpu") -> Artifact:
    """Load the artifact folder `path` on `device`: a target it was exported for
    ("cpu", "vulkan", ...) or an IREE driver of one ("local-task", ...)."""
    if not isinstance(path, (str, os.PathLike)):
        raise ArtifactError(f"tori.runtime.load takes the path of an artifact folder, not {type(path).__name__} {path!r}")
    if not isinstance(device, str):
        raise ArtifactError(f"device must be a target or driver name such as 'cpu' or 'local-task', not "
                            f"{type(device).__name__} {device!r}", path=path)
    return Artifact(path, device)


# ---------------------------------------------------------------------------
# Parameter archives


def write_parameters(path: Path, values: Mapping[str, np.ndarray]) -> None:
    """An IREE parameter archive (.irpa) holding each array's bytes under its name."""
    import iree.runtime as rt

    index = rt.ParameterIndex()
    for name, array in values.items():
        raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8).copy()
        index.add_buffer(name, raw)
    index.create_archive_file(str(path))
    # IREE creates the archive 0640; it gets the mode of the artifact's other files.
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def update_parameters(path: Path | str, values: Mapping[str, Any], *, allow_new: bool = False) -> None:
    """Replace some weights of the artifact at `path` by `values` (name -> array of
    the same dtype and shape), without recompiling: the parameter archive is rewritten
    and the manifest's hashes updated. Each file is written beside and renamed."""
    import iree.runtime as rt

    folder = Path(path)
    manifest = read_manifest(folder)
    where = folder / MANIFEST
    parameters = manifest.get("parameters")
    if not parameters:
        raise ArtifactError("the artifact has its weights inside the module; export with external_weights=True "
                            "to update them without recompiling", path=where, field="parameters")
    entries = parameters["entries"]
    for name, value in values.items():
        if name not in entries:
            raise ArtifactError(f"has no parameter {name!r}", path=where, field="parameters.entries")
        array = np.asarray(value)
        expected = entries[name]
        if array.dtype != NUMPY_DTYPES[expected["dtype"]] or list(array.shape) != expected["shape"]:
            raise ArtifactError(f"parameter {name!r} is {expected['dtype']}{expected['shape']}, got "
                                f"{array.dtype.name}{list(array.shape)}", path=where, field=f"parameters.entries.{name}")
    archive = folder / parameters["file"]
    index = rt.ParameterIndex()
    index.load(str(archive), mmap=False)
    current = dict(index.items())
    merged: dict[str, np.ndarray] = {}
    for name, spec in entries.items():
        if name in values:
            merged[name] = np.asarray(values[name])
        else:
            flat = rt.parameter_index_entry_as_numpy_flat_ndarray(current[name])
            merged[name] = np.array(flat, copy=True).view(NUMPY_DTYPES[spec["dtype"]]).reshape(spec["shape"])
    del index, current
    fresh = archive.with_name(archive.name + ".new")
    write_parameters(fresh, merged)
    os.replace(fresh, archive)
    manifest["files"][parameters["file"]] = describe_files(folder, [parameters["file"]])[parameters["file"]]
    staged = folder / (MANIFEST + ".new")
    manifest["content_hash"] = content_hash(manifest)
    staged.write_text(json.dumps(manifest, indent=2) + "\n")
    os.replace(staged, where)


def replace_folder(staging: Path, destination: Path) -> None:
    """Move the complete folder `staging` to `destination`, replacing what is there."""
    if destination.exists():
        retired = destination.with_name(f".{destination.name}.old-{os.getpid()}")
        os.replace(destination, retired)
        os.replace(staging, destination)
        shutil.rmtree(retired, ignore_errors=True)
    else:
        os.replace(staging, destination)

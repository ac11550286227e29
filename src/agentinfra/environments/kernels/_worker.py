"""The worker: runs a reference problem or a candidate submission, one command at a time.

Started by the supervisor as ``python -I -m agentinfra.environments.kernels._worker
FD_IN FD_OUT FD_SOCKET``, or forked into its jail by the grader's fork server, which
calls `serve` with the same descriptors (inside the sandbox for a candidate). It
reads `_wire` frames from FD_IN and answers on FD_OUT. FD_SOCKET (a Unix socket)
delivers a file (a memfd) just before a ``pool_make`` or ``pool`` frame that says
``receive_fd`` (the pool file: writable for ``pool_make``, where the reference fills
it; ``pool`` reads it on CUDA) and before every ``stage`` frame (that batch's own
copy). Every file a candidate receives was sealed against every write before it
was sent.
In a candidate process everything here may be
patched by the submission, so the supervisor trusts none of its answers: it
compares output bytes itself, times batches with its own clock and audits
committed output hashes.

Commands: ``estimate`` (reference only, before ``load``: the bytes of parameters,
inputs and output, from the problem built on torch's meta device, so nothing is
allocated), ``load`` (build the model), ``mode`` (``eval``: both models in eval
mode), ``gen`` (reference only: inputs and the expected output for a seed and
variant; with ``repeat`` the output is computed twice on the same inputs, and only
the two outputs are returned), ``pool_make`` (reference only: the timing inputs of many seeds,
written into the pool file), ``call`` (one call on given inputs),
``pool`` (store timing inputs: from the sealed pool file, or from the frame;
with ``staged``, only their layout), ``stage`` (map the next batch's inputs from its
file), ``batch`` (timed calls, answers with a hash of each output), ``fetch`` (outputs of the last batch), ``peaks`` (machine peak
FLOP/s and bandwidth), ``exit``.

Why one file of about 600 lines, unlike the supervisor's modules: it is the one program
that runs inside the jail, and the jail's root holds exactly the modules it needs
(`_workers.worker_jail` binds this file and `_wire.py`; the fork server preloads the
same two). Every module split off would join that allowlist and the preload, and so
what each candidate can read; one file keeps the in-jail program and its view whole.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import math
import mmap
import os
import socket
import sys
import time
import traceback
from typing import Any

from agentinfra.environments.kernels._wire import (
    Frame,
    TensorBytes,
    WireError,
    digest,
    encode_frame,
    read_frame,
)

_MAX_PAYLOAD = 8 << 30
_VARIANT_SCALE = 100.0
_VARIANT_SHIFT = 3.0
_L2_FLUSH_BYTES = 256 << 20  # larger than any current GPU's L2 (H100/H200: 50-60 MB)
_TENSOR_ALIGN = 64  # each tensor in the pool file starts on a cache line
_MADV_POPULATE_READ = 22  # linux/mman.h; Python's mmap has no name for it before 3.13
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4  # glibc's mallopt parameters (malloc.h)
_NEVER_TRIM = -1  # mallopt's int, which glibc reads as the largest size_t: the heap never shrinks


def _torch() -> Any:
    import torch

    return torch


def _raw(tensor: Any) -> tuple[str, tuple[int, ...], Any]:
    """A tensor's dtype name, shape and its bytes as a flat uint8 array (a view where it can be)."""
    torch = _torch()
    plain = torch.Tensor.contiguous(torch.Tensor.cpu(torch.Tensor.detach(tensor)))
    flat = plain.reshape(-1)
    raw = flat.view(torch.uint8) if plain.dtype != torch.bool else flat.to(torch.uint8)
    return str(plain.dtype).removeprefix("torch."), tuple(plain.shape), raw.numpy()


def tensor_to_bytes(tensor: Any) -> TensorBytes:
    name, shape, raw = _raw(tensor)
    return TensorBytes(name, shape, raw.tobytes())


def bytes_to_tensor(item: TensorBytes, device: str = "cpu") -> Any:
    torch = _torch()
    flat = (
        torch.frombuffer(bytearray(item.data), dtype=torch.uint8)
        if item.data
        else torch.empty(0, dtype=torch.uint8)
    )
    if item.dtype == "bool":
        return flat.to(torch.bool).reshape(item.shape).to(device)
    return flat.view(getattr(torch, item.dtype)).reshape(item.shape).to(device)


def encode_values(values: Any, tensors: list[Any], *, as_bytes: bool = True) -> Any:
    """Plain JSON for nested lists of numbers and strings; each tensor goes to ``tensors``, as its
    bytes (or, with ``as_bytes=False``, as it is), and is referred to by its index there."""
    torch = _torch()
    if isinstance(values, torch.Tensor):
        tensors.append(tensor_to_bytes(values) if as_bytes else values)
        return {"__tensor__": len(tensors) - 1}
    if isinstance(values, list | tuple):
        return [encode_values(v, tensors, as_bytes=as_bytes) for v in values]
    if values is None or isinstance(values, bool | int | float | str):
        return values
    raise TypeError(f"cannot pass a {type(values).__name__} between processes")


def _tensor_refs(values: Any) -> list[int]:
    """The tensor indices an `encode_values` structure refers to."""
    if isinstance(values, dict) and "__tensor__" in values:
        return [int(values["__tensor__"])]
    if isinstance(values, list):
        return [i for v in values for i in _tensor_refs(v)]
    return []


def decode_values(values: Any, tensors: list[Any], device: str, *, as_bytes: bool = True) -> Any:
    """`encode_values` undone: each reference becomes its tensor (built from its bytes, or, with
    ``as_bytes=False``, taken as it is from ``tensors``)."""
    if isinstance(values, dict) and "__tensor__" in values:
        item = tensors[int(values["__tensor__"])]
        return bytes_to_tensor(item, device) if as_bytes else item
    if isinstance(values, list):
        return [decode_values(v, tensors, device, as_bytes=as_bytes) for v in values]
    return values


def _import_file(path: str, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


class Worker:
    """One reference or candidate model and its command handlers."""

    def __init__(self) -> None:
        self.role = ""
        self.device = "cpu"
        self.module: Any = None
        self.model: Any = None
        self.pool: list[list[Any]] = []
        self.pool_layout: dict[str, Any] = {}
        """Staged timing (``pool`` with ``staged``): each entry's structure and each tensor's spec, no data."""
        self.staged: list[list[Any]] = []
        """The inputs of the next timed batch, mapped from its file by ``stage``."""
        self.fd_socket: socket.socket | None = None
        """Where the supervisor sends the pool file."""
        self.pool_fd: int | None = None
        """The pool file (a memfd the supervisor made): the reference writes it, both read it sealed."""
        self.last_outputs: list[Any] = []
        self.scratch: Any = None
        self.initial_state: dict[str, Any] | None = None

    def _sync(self) -> None:
        if self.device == "cuda":
            _torch().cuda.synchronize()

    def estimate(self, frame: Frame) -> tuple[dict[str, Any], list[TensorBytes]]:
        """Bytes of parameters, one input set and one output, on the meta device (nothing allocated).

        Each figure is None where the problem's code cannot run on the meta device.
        """
        torch = _torch()
        self.module = _import_file(frame.header["path"], "agentinfra_problem")

        def size(values: Any) -> int:
            items = values if isinstance(values, list | tuple) else [values]
            return sum(x.numel() * x.element_size() for x in items if isinstance(x, torch.Tensor))

        found: dict[str, Any] = {"params_bytes": None, "inputs_bytes": None, "output_bytes": None}
        distributions = torch.distributions.Distribution
        validate = distributions._validate_args
        distributions.set_default_validate_args(False)  # its checks read values meta tensors lack
        with contextlib.suppress(Exception), torch.device("meta"):
            init = list(self.module.get_init_inputs())
            inputs = list(self.module.get_inputs())
            found["inputs_bytes"] = size(inputs)
            model = self.module.Model(*init)
            found["params_bytes"] = size(list(model.state_dict().values()))
            with torch.no_grad():
                found["output_bytes"] = size(model(*inputs))
        distributions.set_default_validate_args(validate)
        return found, []

    def mode(self, frame: Frame) -> tuple[dict[str, Any], list[TensorBytes]]:
        """``eval``: eval mode; the reference also goes back to the state it was built with (its
        training-mode self-check calls moved BatchNorm's running statistics; the candidate's never ran)."""
        if frame.header.get("eval"):
            if self.role == "reference" and self.initial_state is not None:
                self.model.load_state_dict(self.initial_state, strict=False)
            self.model.eval()
        return {}, []

    def load(self, frame: Frame) -> tuple[dict[str, Any], list[TensorBytes]]:
        torch = _torch()
        header = frame.header
        self.role, self.device = header["role"], header.get("device", "cpu")
        torch.set_num_threads(int(header["threads"]))
        seed = int(header["seed"])
        if self.role == "reference":
            if self.module is None:
                self.module = _import_file(header["path"], "agentinfra_problem")
            torch.manual_seed(seed)
            init = list(self.module.get_init_inputs())
            torch.manual_seed(seed)
            self.model = self.module.Model(*init).to(self.device)
            tensors: list[TensorBytes] = []
            encoded_init = encode_values(init, tensors)
            names: list[str] = []
            # buffers only (BatchNorm's running statistics move in training mode; parameters do not)
            self.initial_state = {k: v.clone() for k, v in self.model.named_buffers()}
            for name, value in self.model.state_dict().items():
                names.append(name)
                tensors.append(tensor_to_bytes(value))
            return {
                "init": encoded_init,
                "state_names": names,
                "init_tensor_count": len(tensors) - len(names),
            }, tensors
        count = int(header["init_tensor_count"])
        init = decode_values(header["init"], frame.tensors[:count], self.device)
        self.module = _import_file(header["path"], "submission")
        if not hasattr(self.module, "ModelNew"):
            raise AttributeError("submission defines no ModelNew")
        torch.manual_seed(seed)
        self.model = self.module.ModelNew(*init).to(self.device)
        own = self.model.state_dict()
        matched = 0
        with torch.no_grad():
            for name, item in zip(header["state_names"], frame.tensors[count:], strict=True):
                if name in own and tuple(own[name].shape) == item.shape:
                    own[name].copy_(bytes_to_tensor(item, self.device))
                    matched += 1
        return {"matched": matched}, []

    def _call(self, inputs: list[Any]) -> Any:
        torch = _torch()
        with torch.no_grad():
            return self.model(*inputs)

    def _inputs(
        self, seed: int, variant: str = "base", shape: dict[str, Any] | None = None
    ) -> list[Any]:
        """The problem's ``get_inputs()`` under ``seed``, with ``shape`` overrides and ``variant`` applied."""
        torch = _torch()
        shape = shape or {}
        saved = {k: getattr(self.module, k) for k in shape if hasattr(self.module, k)}
        try:
            for key, value in shape.items():
                setattr(self.module, key, value)
            torch.manual_seed(seed)
            inputs = [
                x.to(self.device) if isinstance(x, torch.Tensor) else x
                for x in self.module.get_inputs()
            ]
        finally:
            for key, value in saved.items():
                setattr(self.module, key, value)
        for index, value in enumerate(inputs):
            if isinstance(value, torch.Tensor) and value.is_floating_point():
                if variant == "scaled":
                    inputs[index] = value * _VARIANT_SCALE
                elif variant == "shifted":
                    inputs[index] = value + _VARIANT_SHIFT
                elif variant == "sign_flipped":
                    inputs[index] = -value
        return inputs

    def gen(self, frame: Frame) -> tuple[dict[str, Any], list[TensorBytes]]:
        torch = _torch()
        header = frame.header
        inputs = self._inputs(
            int(header["seed"]), header.get("variant", "base"), header.get("shape")
        )
        output = self._call([x.clone() if isinstance(x, torch.Tensor) else x for x in inputs])
        self._sync()
        again = None
        if header.get("repeat"):
            again = self._call([x.clone() if isinstance(x, torch.Tensor) else x for x in inputs])
            self._sync()
        tensors: list[TensorBytes] = []
        # the self-check (``repeat``) compares two outputs: its frame carries no inputs, so it
        # is never larger than a case's (inputs and one output) by more than an output
        encoded = encode_values(inputs, tensors) if again is None else None
        finite = bool(torch.isfinite(output).all()) if output.is_floating_point() else True
        tensors.append(tensor_to_bytes(output))
        reply: dict[str, Any] = {"inputs": encoded, "finite": finite}
        if again is not None:
            tensors.append(tensor_to_bytes(again))
            reply["random_modules"] = sorted(
                {type(m).__name__ for m in self.model.modules() if _random_in_training(m)}
            )
        return reply, tensors

    def call(self, frame: Frame) -> tuple[dict[str, Any], list[TensorBytes]]:
        torch = _torch()
        count = len(frame.tensors)
        inputs = decode_values(frame.header["inputs"], frame.tensors[:count], self.device)
        _poison(self.device)
        output = self._call(inputs)
        self._sync()
        after = [
            digest(tensor_to_bytes(x)) if isinstance(x, torch.Tensor) else repr(x) for x in inputs
        ]
        kind = f"{type(output).__module__}.{type(output).__qualname__}"
        if type(output) is not torch.Tensor:
            return {"output_type": kind, "inputs_after": after}, []
        return {"output_type": kind, "inputs_after": after}, [tensor_to_bytes(output)]

    def make_pool(self, frame: Frame) -> tuple[dict[str, Any], list[TensorBytes]]:
        """Reference only: the base inputs of each seed, written back to back into the pool file.

        Answers each entry's encoded structure and each tensor's ``[dtype, shape, offset]``;
        the supervisor then seals the file. Each tensor starts on a cache line; with
        ``align_every`` each run of that many entries (a timed batch) starts on a page, and
        ``starts`` gives those offsets, so a batch's bytes can be copied and mapped alone.
        Each entry's tensors are freed once written, so this process's heap is left no
        fuller than the candidate's.
        """
        self._receive_pool_file(frame)
        assert self.pool_fd is not None
        align_every = int(frame.header.get("align_every") or 0)
        entries: list[Any] = []
        live: list[Any] = []
        specs: list[list[Any]] = []
        starts: list[int] = []
        offset = 0
        os.ftruncate(self.pool_fd, 0)
        for index, seed in enumerate(frame.header["seeds"]):
            if align_every and index % align_every == 0:
                offset = -(-offset // mmap.PAGESIZE) * mmap.PAGESIZE
                starts.append(offset)
            entries.append(encode_values(self._inputs(int(seed)), live, as_bytes=False))
            for position in range(len(specs), len(live)):
                offset = -(-offset // _TENSOR_ALIGN) * _TENSOR_ALIGN
                name, shape, raw = _raw(live[position])
                _pwrite_all(self.pool_fd, memoryview(raw), offset)
                specs.append([name, list(shape), offset])
                offset += raw.nbytes
                live[position] = None
        return {"entries": entries, "specs": specs, "bytes": offset, "starts": starts}, []

    def store_pool(self, frame: Frame) -> tuple[dict[str, Any], list[TensorBytes]]:
        """Timing inputs: from the sealed pool file (``shared``: a private copy of each tensor) or
        the frame; with ``staged``, only the layout, and ``stage`` maps each batch's inputs."""
        if frame.header.get("staged"):
            self.pool, self.staged = [], []
            self.pool_layout = {"entries": frame.header["entries"], "specs": frame.header["specs"]}
            return {"size": len(self.pool_layout["entries"])}, []
        if frame.header.get("shared"):
            self._receive_pool_file(frame)
            if self.pool_fd is None:
                raise RuntimeError("no pool file was received")
            tensors = [
                _read_tensor(self.pool_fd, spec, self.device) for spec in frame.header["specs"]
            ]
            self.pool = [
                decode_values(entry, tensors, self.device, as_bytes=False)
                for entry in frame.header["entries"]
            ]
        else:
            self.pool = [
                decode_values(entry, frame.tensors, self.device)
                for entry in frame.header["entries"]
            ]
        return {"size": len(self.pool)}, []

    def _receive_pool_file(self, frame: Frame) -> None:
        """With ``receive_fd``: the pool file sent on the descriptor socket just before this frame."""
        if not frame.header.get("receive_fd"):
            return
        fd = self._receive_fd()
        if self.pool_fd is not None:
            os.close(self.pool_fd)
        self.pool_fd = fd

    def _receive_fd(self) -> int:
        """The descriptor sent on the descriptor socket just before this frame."""
        if self.fd_socket is None:
            raise RuntimeError("this worker was started without a descriptor socket")
        _, fds, _, _ = socket.recv_fds(self.fd_socket, 16, 1)
        if not fds:
            raise RuntimeError("no file arrived on the descriptor socket")
        for extra in fds[1:]:
            os.close(extra)
        return fds[0]

    def stage(self, frame: Frame) -> tuple[dict[str, Any], list[TensorBytes]]:
        """The next batch's inputs: entries ``first`` to ``first + count - 1``, whose ``length``
        bytes are the file received with this frame (a copy of the pool file's bytes from
        offset ``base``). Mapped private (a write copies the page) and populated for
        reading, so the timed calls take no page faults but the inputs are not pulled into
        the caches either, as when they were copied long before."""
        torch = _torch()
        self.staged = []
        layout = self.pool_layout
        first, count = int(frame.header["first"]), int(frame.header["count"])
        length, base = int(frame.header["length"]), int(frame.header["base"])
        fd = self._receive_fd()
        prot = mmap.PROT_READ | mmap.PROT_WRITE
        try:
            buffer = mmap.mmap(fd, length, flags=mmap.MAP_PRIVATE, prot=prot) if length else None
        finally:
            os.close(fd)
        if buffer is not None:
            _populate(buffer)
        entries = layout["entries"][first : first + count]
        tensors: list[Any] = [None] * len(layout["specs"])
        for index in (i for entry in entries for i in _tensor_refs(entry)):
            name, shape, offset = layout["specs"][index]
            dtype = getattr(torch, str(name))
            numel = math.prod(int(d) for d in shape)
            tensors[index] = (
                torch.frombuffer(buffer, dtype=dtype, count=numel, offset=int(offset) - base).reshape(shape)
                if numel and buffer is not None
                else torch.empty(shape, dtype=dtype)
            )  # fmt: skip
        self.staged = [decode_values(e, tensors, self.device, as_bytes=False) for e in entries]
        return {"size": len(self.staged)}, []

    def batch(self, frame: Frame) -> tuple[dict[str, Any], list[TensorBytes]]:
        torch = _torch()
        self.last_outputs = []
        if self.device == "cuda":
            return self._batch_cuda(frame)
        pool = self.staged if frame.header.get("staged") else None
        for position, index in enumerate(frame.header["indices"]):
            self.last_outputs.append(
                self._call(pool[position] if pool is not None else self.pool[int(index)])
            )
        self._sync()
        commits = [
            digest(tensor_to_bytes(out)) if type(out) is torch.Tensor else "not-a-tensor"
            for out in self.last_outputs
        ]
        return {"commits": commits}, []

    def _batch_cuda(self, frame: Frame) -> tuple[dict[str, Any], list[TensorBytes]]:
        """Per call: flush L2 (rewrite a buffer larger than it), then time with CUDA events."""
        torch = _torch()
        if self.scratch is None:
            self.scratch = torch.empty(_L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda")
        events = []
        for index in frame.header["indices"]:
            self.scratch.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            self.last_outputs.append(self._call(self.pool[int(index)]))
            end.record()
            events.append((start, end))
        torch.cuda.synchronize()
        device_ms = sum(start.elapsed_time(end) for start, end in events)
        commits = [
            digest(tensor_to_bytes(out)) if type(out) is torch.Tensor else "not-a-tensor"
            for out in self.last_outputs
        ]
        return {"commits": commits, "device_ms": device_ms}, []

    def fetch(self, frame: Frame) -> tuple[dict[str, Any], list[TensorBytes]]:
        return {}, [tensor_to_bytes(self.last_outputs[int(p)]) for p in frame.header["positions"]]

    def peaks(self, frame: Frame) -> tuple[dict[str, Any], list[TensorBytes]]:
        torch = _torch()
        size = 1024
        a = torch.randn(size, size, device=self.device)
        b = torch.randn(size, size, device=self.device)
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            torch.mm(a, b)
            self._sync()
            best = min(best, time.perf_counter() - start)
        big = torch.empty(64 << 20, dtype=torch.uint8, device=self.device)
        other = torch.empty_like(big)
        copy = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            other.copy_(big)
            self._sync()
            copy = min(copy, time.perf_counter() - start)
        return {"flops_per_s": 2 * size**3 / best, "bytes_per_s": 2 * big.numel() / copy}, []


def warm_up() -> None:
    """Run by the fork server's zygote before it forks: the first computation on torch's meta
    device imports about 800 modules (the size estimate's first use cost 0.3-1 s per worker)."""
    torch = _torch()
    with torch.device("meta"):
        (torch.rand(2, 3) + 0.1).log().sum(1)


def _populate(buffer: mmap.mmap) -> None:
    """Every page of ``buffer`` mapped for reading, without copying or reading its data into the
    caches (``MADV_POPULATE_READ``, Linux 5.14); older kernels: one byte read per page."""
    try:
        buffer.madvise(_MADV_POPULATE_READ)
    except OSError:
        buffer[:: mmap.PAGESIZE]


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    while data:
        written = os.pwrite(fd, data[: 1 << 30], offset)
        data, offset = data[written:], offset + written


def _read_tensor(fd: int, spec: list[Any], device: str) -> Any:
    """A fresh tensor holding ``spec``'s ``[dtype, shape, offset]`` bytes of the pool file."""
    torch = _torch()
    name, shape, offset = str(spec[0]), [int(d) for d in spec[1]], int(spec[2])
    tensor = torch.empty(shape, dtype=getattr(torch, name))
    view = memoryview(tensor.reshape(-1).view(torch.uint8).numpy()).cast("B")
    while view:
        count = os.preadv(fd, [view[: 1 << 30]], offset)
        if count <= 0:
            raise ValueError(f"pool file ends before byte {offset}")
        view, offset = view[count:], offset + count
    return tensor.to(device) if device != "cpu" else tensor


def _random_in_training(module: Any) -> bool:
    """Modules whose training-mode output is random: dropout of every kind, RReLU."""
    name = type(module).__name__
    return bool(module.training) and ("Dropout" in name or name == "RReLU")


def _poison(device: str) -> None:
    """Fills and frees memory so that a fresh ``torch.empty`` is likely to hold NaN, not old data."""
    torch = _torch()
    with contextlib.suppress(RuntimeError):
        torch.full((1 << 20,), float("nan"), device=device)


def fix_allocator() -> bool:
    """Puts glibc's allocator in one steady state for both sides; False where it cannot (no glibc).

    By default glibc serves a large block from fresh ``mmap`` pages or from the heap depending
    on what was freed before, so the same call page-faults and zeroes megabytes in one process
    and reuses warm memory in another. Two histories meet here: the reference generates
    inputs and the pool before it is timed, which grows its heap; the candidate does not. A
    block over glibc's largest mmap threshold (32 MiB) then came from the reference's grown
    heap but from fresh pages in the candidate on every call: KernelBench's
    ``level1/72_conv_transposed_3D...`` made 55,000 page faults a call (216 MiB of temporaries)
    in the candidate and none in the reference, and its identity read 0.34x. Smaller blocks
    had moved too (06_attention's speedup 10-16% between gradings).
    Fixed here: every block comes from the heap (no ``mmap`` chunks) and freed memory stays
    there (the heap is never trimmed: a 2 GiB threshold gave ``level2/20``'s 2.1 GiB of
    temporaries back after every call), so from its second call on a call reuses warm
    memory whatever ran before, on both sides, as PyTorch's caching allocator does on a GPU.
    The workers' `_workers.GLIBC_TUNABLES`, read at start, make PyTorch's aligned blocks
    merge when freed. A submission may change this in its own process; that only moves its
    own timing.
    """
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_MAX, 0) and mallopt(_M_TRIM_THRESHOLD, _NEVER_TRIM))


def _write_all(writer: Any, data: bytes) -> None:
    """Writes all of ``data``: one write(2) moves at most about 2 GiB (Linux's MAX_RW_COUNT), and an
    unbuffered file returns after one, so a larger frame was cut short and its reader waited forever."""
    view = memoryview(data)
    while view:
        view = view[writer.write(view[: 1 << 30]) :]


def serve(fd_in: int, fd_out: int, fd_socket: int | None = None) -> None:
    reader = os.fdopen(fd_in, "rb", buffering=1 << 20)
    writer = os.fdopen(fd_out, "wb", buffering=0)
    worker = Worker()
    worker.fd_socket = None if fd_socket is None else socket.socket(fileno=fd_socket)
    handlers = {
        "pool_make": worker.make_pool,
        "estimate": worker.estimate,
        "mode": worker.mode,
        "load": worker.load,
        "gen": worker.gen,
        "call": worker.call,
        "pool": worker.store_pool,
        "stage": worker.stage,
        "batch": worker.batch,
        "fetch": worker.fetch,
        "peaks": worker.peaks,
    }
    allocator = "glibc-fixed" if fix_allocator() else "default"
    _torch()  # imported before hello, so the supervisor can start both workers' imports at once
    hello = {"ok": True, "op": "hello", "pid": os.getpid(), "allocator": allocator,
             # what glibc read at this process's start (the fork server's zygote's, when forked)
             "tunables": os.environ.get("GLIBC_TUNABLES", "")}  # fmt: skip
    _write_all(writer, encode_frame(hello))
    while True:
        try:
            frame = read_frame(reader, max_payload_bytes=_MAX_PAYLOAD)
        except WireError:
            return
        op = frame.header.get("op")
        if op == "exit" or op not in handlers:
            return
        try:
            header, tensors = handlers[op](frame)
            reply = encode_frame({"ok": True, "op": op, **header}, tensors)
        except BaseException as exc:
            detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            reply = encode_frame(
                {"ok": False, "op": op, "error": detail[-2000:], "error_type": type(exc).__name__}
            )
        _write_all(writer, reply)
        # nothing of this request may outlive it: a reply held into the next call was that call's
        # extra address space (an identity over its limit where the reference, sized earlier, was not)
        frame = reply = header = tensors = None  # type: ignore[assignment]


def main() -> None:
    fd_in, fd_out = int(sys.argv[1]), int(sys.argv[2])
    fd_socket = int(sys.argv[3]) if len(sys.argv) > 3 else None
    sys.stdout = sys.stderr
    serve(fd_in, fd_out, fd_socket)
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()

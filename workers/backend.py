"""Which device a rank runs on, and which torch.distributed backend connects the ranks.

    backend  device      collectives  needs
    -------  ----------  -----------  ----------------------------
    cpu      cpu         gloo         nothing
    npu      npu:<id>    hccl         torch_npu (imported here, only here)
    cuda     cuda:<id>   nccl         a CUDA build of torch

`auto` picks npu, then cuda, then cpu, by what this interpreter can import and see.

The seeds' runtime sizing (--ring-heap, --weight-bank-size) is handed to the backend at
start-up (`size_runtime`). These three run through torch, whose allocator sizes device
memory itself, so none uses it: each says so once, and a backend that drives its device
runtime directly takes the sizes there.
"""

from __future__ import annotations

import importlib.util
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from workers.runtime_sizing import log_unused

log = logging.getLogger("workers.backend")
DIST_BACKENDS = {"cpu": "gloo", "npu": "hccl", "cuda": "nccl"}

DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
}


def torch_dtype(name: str) -> torch.dtype:
    """The activation dtype for a --dtype name ("auto" is resolved by the caller)."""
    try:
        return DTYPES[name.lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; one of {sorted(DTYPES)}") from None


@dataclass(frozen=True)
class Backend:
    name: str  # cpu | npu | cuda
    device_id: int = 0

    @property
    def dist_backend(self) -> str:
        return DIST_BACKENDS[self.name]

    @property
    def device(self) -> torch.device:
        if self.name == "cpu":
            return torch.device("cpu")
        return torch.device(f"{self.name}:{self.device_id}")

    def activate(self) -> None:
        """Import the device plugin and make this rank's device current (before any tensor)."""
        if self.name == "npu":
            import torch_npu  # noqa: F401  (registers torch.npu and the hccl backend)

            torch.npu.set_device(self.device_id)
        elif self.name == "cuda":
            torch.cuda.set_device(self.device_id)

    def size_runtime(self, ring_heap: tuple[int, ...], weight_bank_size: int | None, quiet: bool = False) -> None:
        """Apply the run's runtime sizing; quiet: do not log (one rank per node says it)."""
        if not quiet:
            log_unused(log, self.name, "sizes device memory through torch", ring_heap, weight_bank_size)

    def work_clock(self) -> Callable[[], float]:
        """The clock a rank times its share of a step with (StepResult.work_s), for the
        verify policy's cost model: on the CPU the process's CPU time (its intra-op threads
        included), which other processes sharing the cores do not inflate the way they do
        wall time; on an accelerator wall time after a device sync (the queued kernels are
        the work; the host thread mostly waits)."""
        if self.name == "cpu":
            return time.process_time
        sync = getattr(torch, self.name).synchronize  # torch.cuda / torch.npu

        def clock() -> float:
            sync()
            return time.perf_counter()

        return clock


def select_backend(name: str, device_id: int = 0) -> Backend:
    if name == "auto":
        if importlib.util.find_spec("torch_npu") is not None:
            name = "npu"
        elif torch.cuda.is_available():
            name = "cuda"
        else:
            name = "cpu"
    if name not in DIST_BACKENDS:
        raise ValueError(f"unknown backend {name!r}; one of {sorted(DIST_BACKENDS)} or auto")
    return Backend(name, device_id)

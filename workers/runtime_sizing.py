"""The DSpark runtime's sizing flags (--ring-heap, --weight-bank-size) on backends that
size device memory their own way: validated by the server, handed to every rank, and said
once (by a node's first rank) not to be used, so a deployment command runs as written."""

from __future__ import annotations

import logging


def log_unused(log: logging.Logger, backend: str, how: str, ring_heap: tuple[int, ...], weight_bank_size) -> None:
    heap = ",".join(str(n) for n in ring_heap)
    banks = "all" if weight_bank_size is None else weight_bank_size
    log.info("the %s backend %s: --ring-heap %s and --weight-bank-size %s are not used", backend, how, heap, banks)

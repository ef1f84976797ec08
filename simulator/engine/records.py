"""Per-request records of a run streamed to disk (a run of 10^7 requests cannot hold its state in memory).

In streaming mode (``records`` folder given to :class:`~simulator.engine.engine.Engine`) the engine holds
only a window of requests: those not yet finished and the next ones to arrive. Whenever the window is
used up it writes the records of the requests finished at its start here, in request order, and drops
them. After the run the result's per-request arrays are read-only maps of these files (the OS pages
them in and out), so aggregation reads them like any array. The iteration log and the inter-token
gaps spill to their own files the same way (:meth:`simulator.engine.metrics.Columns.spill_to`).

Files: one raw little-endian column per field, ``<folder>/<field>.bin``, in the dtype of
:data:`RECORD_FIELDS`; request k of the workload is row k of every file.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

RECORD_FIELDS: dict[str, type] = {
    "status": np.int8, "reject_reason": np.int8, "first_scheduled": np.float64, "first_token": np.float64,
    "finish": np.float64, "preemptions": np.int32, "waited_for_kv": np.bool_,
}
"""What a finished request leaves behind (the EngineResult's per-request arrays), with their dtypes."""


class RecordFiles:
    """Append-only per-request columns in ``folder`` (created; earlier files of the same names are replaced)."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.rows = 0
        for name in RECORD_FIELDS:
            self._path(name).write_bytes(b"")

    def _path(self, name: str) -> Path:
        return self.folder / f"{name}.bin"

    def write(self, columns: dict[str, list]) -> None:
        """Append rows: one list per field of :data:`RECORD_FIELDS`, all of one length."""
        count = len(columns["status"])
        for name, dtype in RECORD_FIELDS.items():
            with open(self._path(name), "ab") as file:
                np.asarray(columns[name], dtype=dtype).tofile(file)
        self.rows += count

    def array(self, name: str) -> np.ndarray:
        """The whole column ``name`` as a read-only array mapped from its file."""
        dtype = np.dtype(RECORD_FIELDS[name])
        if not self.rows:
            return np.zeros(0, dtype=dtype)
        return np.memmap(self._path(name), dtype=dtype, mode="r", shape=(self.rows,))

"""Reading one parquet file of AIConfigurator's database with pyarrow, without importing pandas.

``pyarrow.parquet.read_table`` goes through ``pyarrow.dataset``, and pyarrow's ``to_numpy`` asks
for pandas, whose import takes 0.3 to 0.5 s of a first measured run: more than the reads
themselves. ``ParquetFile.read`` reads the same columns without the dataset layer, and
:func:`numbers` views a numeric column's buffers as numpy arrays (copying only where a column has
nulls or a type numpy does not share, through pyarrow's own conversion, or comes in several chunks, which
are joined).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def read_parquet(path: str, columns: Sequence[str] | None = None, dictionary: Sequence[str] = ()) -> Any:
    """The ``columns`` of one parquet file (all where None) as a pyarrow table; ``dictionary``: string columns read
    dictionary-encoded (a few distinct strings over ~10^5 rows). Columns the file lacks are skipped; pyarrow's own
    errors propagate (the callers name the table)."""
    import pyarrow.parquet as pq

    handle = pq.ParquetFile(path, read_dictionary=list(dictionary) or None)
    present = set(handle.schema_arrow.names)
    wanted = None if columns is None else [c for c in columns if c in present]
    return handle.read(columns=wanted)


NUMPY_TYPES: dict[str, type] = {"int8": np.int8, "int16": np.int16, "int32": np.int32, "int64": np.int64,
                                 "uint8": np.uint8, "uint16": np.uint16, "uint32": np.uint32, "uint64": np.uint64,
                                 "float": np.float32, "double": np.float64}
"""pyarrow's primitive type names whose values buffer numpy reads as is"""


def _chunk_numbers(chunk: Any) -> np.ndarray:
    dtype = NUMPY_TYPES.get(str(chunk.type))
    if dtype is None or chunk.null_count:
        return np.asarray(chunk.to_numpy(zero_copy_only=False))
    width = np.dtype(dtype).itemsize
    return np.frombuffer(chunk.buffers()[1], dtype=dtype, count=len(chunk), offset=chunk.offset * width)


def numbers(column: Any) -> np.ndarray:
    """A numeric pyarrow array or chunked column as one numpy array."""
    chunks = column.chunks if hasattr(column, "chunks") else [column]
    if not chunks:
        return np.asarray(column.to_numpy(zero_copy_only=False))
    parts = [_chunk_numbers(chunk) for chunk in chunks]
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def codes(table: Any, name: str) -> tuple[np.ndarray, list]:
    """A string column as (integer codes, the distinct values they index)."""
    import pyarrow as pa

    column = table.column(name).combine_chunks()
    if not pa.types.is_dictionary(column.type):
        column = column.dictionary_encode()
    return numbers(column.indices).astype(np.int64), column.dictionary.to_pylist()

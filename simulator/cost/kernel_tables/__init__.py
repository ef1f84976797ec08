"""Measured kernel times: one internal format, its readers, and the lookups the cost model asks.

A table (:mod:`.table`) holds measured latencies of one operator class on one GPU under one engine
release, in seconds, on a grid of the class's shape keys. Readers fill it from NVIDIA
AIConfigurator's public database (:mod:`.aiconfigurator`, the optional ``measured`` extra) or
from memwall's own CSV (:mod:`.csv_format`, what ``simulate calibrate`` writes). Lookups
(:mod:`.gemm`) interpolate in log space and never extrapolate silently: beyond a table's range the
roofline's shape is scaled to agree with the table at its edge. :mod:`.moe` times an MoE layer's
routed-expert block as one measured latency, shared over its operators. :mod:`.source` chooses the tables
of a run (``--kernels auto|measured|roofline``).
"""

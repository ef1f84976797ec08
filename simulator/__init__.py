"""memwall: a transformer inference cost simulator.

Data flows one way: configs -> layer specs -> cost model -> engine -> metrics -> report.
All quantities inside the package are SI base units (seconds, bytes, FLOPs, FLOP/s, bytes/s).
"""

__version__ = "0.1.0"

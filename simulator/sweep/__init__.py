"""Scenario files, sweeps over their grids, searches (max batch, max QPS, fewest replicas), results files and resume."""

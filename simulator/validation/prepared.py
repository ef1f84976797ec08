"""Runs that differ only in their efficiency ceilings share one preparation (validation's hot path).

Fitting a row's ceilings (:mod:`simulator.validation.crossval`) replays the same run at a dozen
trial efficiencies, and the leave-one-source-out folds replay it again at their own: tens of
thousands of engine runs, each of which :func:`simulator.plan.run.simulate_settings` would prepare
from scratch (settings validated, configs looked up, the deployment planned, the KV cache sized,
the workload built). None of that depends on the compute, memory or expert efficiency except the
:class:`~simulator.cost.system.System`, whose rates and step costs do: the tensor-parallel choice,
the memory plan and the KV cache are sized from memory alone, and the workload from the settings'
lengths and seed. So :class:`PreparedRuns` prepares each run once (by its settings without those
three) and, for other efficiencies, rebuilds only the System (the GPU's efficiency replaced, as
``deployment_from_options`` replaces it: :meth:`System.with_efficiency`) and the settings' three values. The
runs are the same as :func:`simulate_settings`'s, bit for bit (``tests/test_validation_reuse.py`` compares them).
The host seconds per sequence that the validation fits (:data:`HOST_OPTION`) are rebuilt for in the same way
(:meth:`System.with_engine`: the Systems of one run at several host times share their step costs).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import fields, replace
from typing import Any

from pydantic import BaseModel

from simulator.cost.system import System
from simulator.errors import InputError
from simulator.model.engine_profile import CpuOverhead, EngineProfile
from simulator.model.loader import validate
from simulator.plan.engine_run import EngineRun, Prepared, prepare, simulate_prepared

EFFICIENCY_OPTIONS = ("compute_efficiency", "memory_efficiency", "expert_efficiency")
"""The options a prepared run is rebuilt for; every other option is part of what is prepared."""

HOST_OPTION = "host_per_sequence_seconds"
"""An option of :meth:`PreparedRuns.prepare` that is no RunSettings field: the engine profile's host seconds per sequence
per iteration (``cpu.per_sequence_seconds``), replaced as in a profile file with that value (the validation fits it:
:mod:`simulator.validation.crossval`, rule 8); a prepared run is rebuilt for it, as for the efficiencies."""

LOWEST = 1e-3
"""The smallest efficiency the settings accept (RunSettings: compute, memory and expert efficiency in [0.001, 1])."""

PREPARED_KEPT = 1024
"""Preparations remembered, the most recently used (a fold of the validation solves every row of a family again)."""

REQUESTS_KEPT = 1_000_000
"""Most requests the remembered preparations' workloads hold together (a serving run's workload holds its requests'
arrays: a few tens of bytes each)."""

SYSTEMS_KEPT = 256
"""Systems rebuilt for other efficiencies, remembered (rows of one deployment share them and their step-cost memo)."""


class PreparedRuns:
    """``simulate_settings`` for plain engine runs, preparing each run once for all its efficiencies."""

    def __init__(self, kept: int = PREPARED_KEPT) -> None:
        self.kept = kept
        self._prepared: OrderedDict[tuple, tuple[tuple[float, ...], Prepared | InputError]] = OrderedDict()
        self._requests = 0
        self._systems: OrderedDict[tuple, System] = OrderedDict()
        self._fields: OrderedDict[int, tuple[System, tuple]] = OrderedDict()
        self.prepared = 0
        """preparations made from scratch (the rest were rebuilt for other efficiencies)"""

    def simulate(self, options: dict[str, Any]) -> EngineRun:
        """The run of ``options`` (a dict of RunSettings fields), as ``simulate_settings(options)``."""
        return simulate_prepared(self.prepare(options))

    def prepare(self, options: dict[str, Any]) -> Prepared:
        """``prepare(options)``, remembered by the options other than the efficiencies and :data:`HOST_OPTION`;
        InputError as it."""
        host = options.get(HOST_OPTION)
        if HOST_OPTION in options:
            options = {name: value for name, value in options.items() if name != HOST_OPTION}
        given = [options.get(name) for name in EFFICIENCY_OPTIONS]
        if any(isinstance(value, bool) or not isinstance(value, (int, float)) or not LOWEST <= value <= 1.0
               for value in given):
            # an efficiency left to the GPU's own (None), or one the settings refuse: prepared afresh, as given
            return self._with_host(self._fresh(options), host)
        wanted = tuple(float(value) for value in given)  # type: ignore[arg-type]
        key = tuple(sorted((name, value) for name, value in options.items() if name not in EFFICIENCY_OPTIONS))
        try:
            entry = self._prepared.get(key)
        except TypeError:  # an option that does not hash (a list): no reuse
            return self._with_host(self._fresh(options), host)
        if entry is None:
            try:
                made: Prepared | InputError = self._fresh(options)
            except InputError as exc:
                # prepare's refusals (bad settings, no fit, no request fits the cache) come from the settings and
                # memory alone, never from an efficiency the settings accept: the same for every other one
                made = exc
            self._prepared[key] = (wanted, made)
            self._requests += _requests(made)
            while len(self._prepared) > 1 and (len(self._prepared) > self.kept or self._requests > REQUESTS_KEPT):
                self._requests -= _requests(self._prepared.popitem(last=False)[1][1])
        self._prepared.move_to_end(key)
        base_efficiencies, base = self._prepared[key]
        if isinstance(base, InputError):
            raise InputError(str(base)) from None
        if base_efficiencies == wanted and host is None:
            return base
        return self._rebuilt(base, wanted, host, options)

    def _fresh(self, options: dict[str, Any]) -> Prepared:
        prepared = prepare(options)
        self.prepared += 1
        settings = prepared.settings
        if settings.speculative is not None or settings.disaggregate is not None:
            # simulate_settings sends these elsewhere: not a plain run
            raise InputError("validation replays plain engine runs (no --speculative, no --disaggregate)")
        return prepared

    def _rebuilt(self, base: Prepared, wanted: tuple[float, ...], host: float | None,
                 options: dict[str, Any]) -> Prepared:
        """``base`` with the efficiencies ``wanted`` and ``host`` (:data:`HOST_OPTION`; None: the profile's own): a
        new System (and settings), the rest shared."""
        system = base.deployment.system
        if type(system) is not System:  # a pipeline's stages: prepared afresh
            return self._with_host(self._fresh(options), host)
        rebuilt = self._system(system, wanted, host)
        settings = base.settings.model_copy(update=dict(zip(EFFICIENCY_OPTIONS, wanted)))
        return replace(base, settings=settings, deployment=replace(base.deployment, system=rebuilt))

    def _system(self, system: System, wanted: tuple[float, ...], host: float | None) -> System:
        """``system`` rebuilt for the efficiencies ``wanted`` and ``host``, the same object for the same arguments:
        the Systems of one set of efficiencies at several host times share the one without, and its step-cost memo
        (System.with_engine)."""
        key = (self._fields_of(system), wanted, host)
        rebuilt = self._systems.get(key)
        if rebuilt is None:
            if host is not None:
                rebuilt = self._system(system, wanted, None).with_engine(engine_with_host(system.engine, host))
            else:
                compute, memory, expert = wanted
                rebuilt = system.with_efficiency(compute=compute, memory=memory, expert=expert)
            self._systems[key] = rebuilt
            while len(self._systems) > SYSTEMS_KEPT:
                self._systems.popitem(last=False)
        self._systems.move_to_end(key)
        return rebuilt

    def _with_host(self, prepared: Prepared, host: float | None) -> Prepared:
        """``prepared`` (prepared afresh) at the host seconds per sequence ``host`` (None: as it is)."""
        if host is None:
            return prepared
        system = prepared.deployment.system
        if type(system) is not System:
            raise InputError(f"{HOST_OPTION}: a pipeline's stages are not rebuilt for another host time")
        return replace(prepared, deployment=replace(prepared.deployment,
                                                    system=system.with_engine(engine_with_host(system.engine, host))))

    def _fields_of(self, system: System) -> tuple:
        """Every field a System is built from, but the three efficiencies of its GPU: with them, what the rebuilt
        System is a function of, so rows of one deployment share the System of one set of efficiencies (and its
        step-cost memo). Pydantic configs by their JSON (they do not hash), as ``deployment_planner`` keys Systems."""
        remembered = self._fields.get(id(system))
        if remembered is not None and remembered[0] is system:
            self._fields.move_to_end(id(system))
            return remembered[1]
        values = []
        for item in fields(system):
            if not item.init:
                continue
            value = getattr(system, item.name)
            if item.name == "gpu":
                value = value.model_dump_json(exclude={"efficiency": {"compute", "memory", "expert"}})
            elif isinstance(value, BaseModel):
                value = value.model_dump_json()
            else:
                try:
                    hash(value)
                except TypeError:
                    value = repr(value)
            values.append((item.name, value))
        self._fields[id(system)] = (system, tuple(values))
        while len(self._fields) > SYSTEMS_KEPT:
            self._fields.popitem(last=False)
        return tuple(values)


def _requests(prepared: Prepared | InputError) -> int:
    return 0 if isinstance(prepared, InputError) else len(prepared.workload.arrival_seconds)


def engine_with_host(engine: EngineProfile, per_sequence_seconds: float) -> EngineProfile:
    """``engine`` with its host seconds per sequence per iteration replaced (checked as a profile file's)."""
    cpu = validate(CpuOverhead, {**engine.cpu.model_dump(), "per_sequence_seconds": per_sequence_seconds}, HOST_OPTION,
                   plausible=True)
    return engine.model_copy(update={"cpu": cpu})

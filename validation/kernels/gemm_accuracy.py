"""Per-kernel error of memwall's roofline GEMM path against NVIDIA AIConfigurator's measured GEMM tables.

Run from the repository root (the ``measured`` extra, aiconfigurator-core and pyarrow, must be installed):

    python -m validation.kernels.gemm_accuracy            # tables
    python -m validation.kernels.gemm_accuracy --json     # machine output
    python -m validation.kernels.gemm_accuracy --keep-l2-resident   # also the rows whose weights fit in L2
    python -m validation.kernels.gemm_accuracy --write-ceilings     # rewrite validation/kernel_ceilings.json

Prints, per GPU with tables: the roofline path's error with today's GPU configs (before) and with the
parameters of each model form fitted on the OTHER GPUs (after, held out by GPU), by regime of m and by
format; then the fitted parameters per GPU family and the values each memwall GPU config would take.
docs/kernel-accuracy.md explains the method and the figures; simulator/validation/kernel_accuracy.py does
the work.
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib import metadata

from simulator.model.gpu import list_gpus
from simulator.model.gpu_family import family_of
from simulator.model.kernel_ceilings import ceilings_file
from simulator.validation import kernel_accuracy as ka

COLUMNS = ("all", "m<=16", "m=17-256", "m>256", "bf16", "fp8")


def proposals(result: dict) -> dict[str, dict]:
    """The chosen form's parameters for every memwall GPU config, and where they come from.

    A GPU with tables takes its own fit; one without takes its family's fit where the family has a
    tabled GPU, else the fit pooled over every tabled GPU (``all``).
    """
    own = result["gpu_fits"][ka.CHOSEN]
    families = result["family_fits"][ka.CHOSEN]
    out = {}
    for gpu in list_gpus():
        family = family_of(gpu.name)
        if gpu.name in own:
            out[gpu.name] = {"source": "own tables", **own[gpu.name]}
        elif family in families:
            out[gpu.name] = {"source": f"family {family}", **families[family]}
        else:
            out[gpu.name] = {"source": f"all tabled GPUs (no {family or 'family'} tables)", **families["all"]}
    return out


def ceilings_document(result: dict) -> dict:
    """The shipped ``validation/kernel_ceilings.json``: the chosen form's parameters per GPU config, with provenance.

    Read by :mod:`simulator.model.kernel_ceilings` (``--ceilings kernels``); fitted on GEMM kernels only, never on
    the end-to-end validation table.
    """
    try:
        version = metadata.version("aiconfigurator-core")
    except metadata.PackageNotFoundError:  # pragma: no cover - the study needs the package
        version = "unknown"
    return {
        "command": "python -m validation.kernels.gemm_accuracy --write-ceilings",
        "doc": "docs/kernel-accuracy.md",
        "measured_tables": f"aiconfigurator-core {version}: " + ", ".join(
            f"{gpu}: {table}" for gpu, table in sorted(result["tables"].items())),
        "form": ka.CHOSEN,
        "l2_rule": result["l2_rule"],
        "gpus": {gpu: {key: p[key] for key in ("source", "compute", "memory", "memory_latency_seconds", "overlap",
                                               "kernel_launch_seconds", "floor_seconds")}
                 for gpu, p in sorted(result["proposals"].items())},
    }


def _cell(stats: dict) -> str:
    if not stats["rows"]:
        return "-".center(11)
    return f"{100 * stats['median_abs_error']:4.0f}/{100 * stats['p90_abs_error']:4.0f}%"


def _params(p: dict) -> str:
    floors = ", ".join(f"{d} {1e6 * s:.1f} us" for d, s in p["floor_seconds"].items()) or "none"
    return (f"compute {p['compute']:.3f}  memory {p['memory']:.3f}  latency {1e6 * p['memory_latency_seconds']:.2f} us  "
            f"overlap {p['overlap']:.2f}  launch {1e6 * p['kernel_launch_seconds']:.1f} us  floor: {floors}")


def render(result: dict, sources: dict[str, str]) -> str:
    lines = ["Per-kernel |predicted / measured - 1|, median / p90 (rows: AIConfigurator GEMM tables; "
             f"n, k >= {result['min_features']}; {result['l2_rule']})", ""]
    if result.get("l2_resident_kept"):
        lines[0] += " -- L2-RESIDENT ROWS KEPT (--keep-l2-resident)"
    header = f"{'GPU':16} {'model':32} " + " ".join(f"{c:>11}" for c in COLUMNS)
    for gpu, before in result["before"].items():
        lines.append(f"{gpu} ({sources.get(gpu, '')})")
        lines.append(header)
        lines.append(f"{'':16} {'before (config)':32} " + " ".join(f"{_cell(before[c]):>11}" for c in COLUMNS))
        for form, by_gpu in result["after"].items():
            mark = " *" if form == ka.CHOSEN else ""
            lines.append(f"{'':16} {('held out: ' + form + mark):32} "
                         + " ".join(f"{_cell(by_gpu[gpu][c]):>11}" for c in COLUMNS))
        lines.append("")
    lines.append(f"* chosen form: {ka.CHOSEN}. Forms: " + "; ".join(f"{k}: {v}" for k, v in result["forms"].items()))
    lines.append("")
    lines.append(f"Fitted parameters of {ka.CHOSEN} per GPU family (ceilings as fractions of each GPU's data-sheet "
                 "peak and bandwidth):")
    for family, p in result["family_fits"][ka.CHOSEN].items():
        lines.append(f"  {family:14} {_params(p)}")
    lines.append("")
    lines.append("Proposed per GPU config (not applied):")
    for gpu, p in result["proposals"].items():
        lines.append(f"  {gpu:16} {_params(p)}   [{p['source']}]")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--keep-l2-resident", action="store_true",
                        help="also score and fit the rows whose weights fit in L2 (a sensitivity check; see the doc)")
    parser.add_argument("--write-ceilings", action="store_true",
                        help=f"also write the chosen form's parameters per GPU to {ceilings_file()} (--ceilings kernels)")
    args = parser.parse_args(argv)
    if args.write_ceilings and args.keep_l2_resident:
        parser.error("--write-ceilings writes the default study's fits; leave out --keep-l2-resident")
    groups, sources = ka.tabled_groups(keep_l2_resident=args.keep_l2_resident)
    if not groups:
        print("no measured GEMM tables found: pip install 'memwall[measured]'", file=sys.stderr)
        return 1
    result = ka.study(groups)
    result["proposals"] = proposals(result)
    result["tables"] = sources
    result["chosen_form"] = ka.CHOSEN
    result["l2_resident_kept"] = args.keep_l2_resident
    if args.write_ceilings:
        target = ceilings_file()
        target.write_text(json.dumps(ceilings_document(result), indent=1) + "\n")
        print(f"wrote {target}", file=sys.stderr)
    print(json.dumps(result, indent=1) if args.json else render(result, sources))
    return 0


if __name__ == "__main__":
    sys.exit(main())

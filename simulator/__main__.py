"""``python -m simulator``: the same command line as ``simulate``."""

from simulator.cli import main

if __name__ == "__main__":
    main(prog_name="simulate")

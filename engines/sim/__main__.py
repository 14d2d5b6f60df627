"""``python -m engines.sim``: start the engine simulator (see :mod:`engines.sim.cli`)."""

from engines.sim.cli import main

if __name__ == "__main__":
    main()

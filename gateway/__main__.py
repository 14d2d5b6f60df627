"""``python -m gateway`` is the ``speedgate`` command."""

import sys

from gateway.cli import main

sys.exit(main())

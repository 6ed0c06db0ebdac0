"""``python -m jaxremat``: the ``jaxremat`` command."""

import sys

from jaxremat.cli import main

sys.exit(main())

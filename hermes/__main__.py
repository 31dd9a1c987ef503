"""`python -m hermes`: the command line (see hermes.cli)."""

import sys

from hermes.cli.main import main

sys.exit(main())

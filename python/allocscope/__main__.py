"""`python -m allocscope`: the command line (cli/)."""

import sys

from .cli import main

sys.exit(main())

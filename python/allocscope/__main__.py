"""`python -m allocscope`: the command line (cli/)."""

import sys

from .cli import main
from .common.heap import reuse_freed_memory

# this process is the command's own (never a user's): its memory settings
# are ours to choose
reuse_freed_memory()
sys.exit(main())

"""`python -m rlhf.cli ...` is the `rlhf` command."""

import sys

from rlhf.cli import main

sys.exit(main())

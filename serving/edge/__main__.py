"""`python -m serving.edge`: the measuring proxy (see serving.edge.cli)."""

import sys

from serving.edge.cli import main

sys.exit(main())

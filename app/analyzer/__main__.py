"""`python -m app.analyzer analyze TRACE`: the `prefixscope` command without its console script."""

import sys

from app.analyzer.cli import main

sys.exit(main())

"""`python -m app.analyzer analyze TRACE`: the `prefixscope` command without its console script."""

from app.analyzer.cli import run

run()

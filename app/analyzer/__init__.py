"""The offline analyzer: `prefixscope analyze TRACE` reads a JSON-lines request trace and reports
its hit rate, miss causes, cache killers, templates or prefix families and a what-if curve of
capacity, with the domain code the server diagnoses with. No database and no Django: an
import-linter contract in pyproject.toml keeps it so."""

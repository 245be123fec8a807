""".env.example lists every variable the code reads."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
READS = re.compile(
    r"""(?:env_(?:str|bool|int|float|list|choice)|os\.environ\.get|environ\.get)\(\s*["']([A-Z][A-Z0-9_]+)["']"""
)


def variables_read_by_the_code() -> set[str]:
    sources = [*ROOT.glob("app/**/*.py"), ROOT / "gunicorn.conf.py"]
    return {name for path in sources for name in READS.findall(path.read_text())}


def test_every_variable_the_code_reads_is_in_env_example() -> None:
    listed = set(re.findall(r"^([A-Z][A-Z0-9_]+)=", (ROOT / ".env.example").read_text(), re.MULTILINE))
    read = variables_read_by_the_code()
    assert "DATABASE_URL" in read  # the pattern finds what settings.py reads
    assert "PREFIXSCOPE_GPU_HOUR_PRICE" in read  # env_float's too
    assert read - listed == set()

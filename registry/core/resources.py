"""Where the files the package carries are: the Alembic migrations, the shipped encoder checkpoint, the shipped
query vectors and the example dataset (MMLU-Pro, `example_data`). A built wheel holds them inside the package
(`registry/shipped/`, copied there by setup.py at build time); a source checkout keeps them at the repo's top level
(`alembic/`, `alembic.ini`, `data/`), where they are edited."""
from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]
INSTALLED = PACKAGE / "shipped"
CHECKOUT = PACKAGE.parent


def base() -> Path:
    """The folder holding `alembic.ini`, `alembic/` and `data/`: the installed copy when there is one."""
    return INSTALLED if (INSTALLED / "alembic.ini").is_file() else CHECKOUT


def alembic_ini() -> Path:
    return base() / "alembic.ini"


def alembic_dir() -> Path:
    return base() / "alembic"


def data_dir() -> Path:
    return base() / "data"


def example_data() -> Path:
    """The example dataset's folder (31 models' real MMLU-Pro results, Apache-2.0): what `registry import --example`
    imports. A wheel carries it; a checkout reads the shared data beside it (../shared/data/mmlu-pro, never
    committed)."""
    if base() == INSTALLED:
        return INSTALLED / "data" / "mmlu-pro"
    return CHECKOUT.parent / "shared" / "data" / "mmlu-pro"

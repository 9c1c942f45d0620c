"""The build step pyproject.toml cannot say: copy the migrations, alembic.ini, the shipped encoder and vectors and the
example dataset into the package (`registry/shipped/`), so that a wheel works outside the checkout
(registry/core/resources.py finds them there)."""
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
SHIPPED = [("alembic.ini", "alembic.ini"), ("alembic/env.py", "alembic/env.py"),
           ("alembic/script.py.mako", "alembic/script.py.mako")]
SHIPPED += [(f"alembic/versions/{p.name}",) * 2 for p in sorted((HERE / "alembic" / "versions").glob("*.py"))]
SHIPPED += [(f"data/{p.name}",) * 2 for p in sorted((HERE / "data").iterdir())
            if p.suffix in (".safetensors", ".parquet")]
# the example dataset (MMLU-Pro, Apache-2.0, its LICENSE and README beside it), read from the shared data beside the
# checkout (never committed) when a wheel is built there: `registry import --example`
EXAMPLE = HERE.parent / "shared" / "data" / "mmlu-pro"
SHIPPED += [(EXAMPLE / p.name, f"data/mmlu-pro/{p.name}") for p in sorted(EXAMPLE.iterdir()) if p.is_file()] \
    if EXAMPLE.is_dir() else []


class BuildWithShipped(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):     # an editable install reads them from the checkout
            return
        dest = Path(self.build_lib) / "registry" / "shipped"
        for src, rel in SHIPPED:
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(HERE / src, dest / rel)


setup(cmdclass={"build_py": BuildWithShipped})

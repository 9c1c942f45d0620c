"""Results in and out in other formats: `import_paths` reads files with the reader of the import table that is named
(or the one that recognises them) and imports them whole, each model with `register`'s report; `export_eee` writes the
registry's current evaluations as Every Eval Ever 0.3 files, checked against EEE's schemas. The readers and the
writer are data/formats/."""
from __future__ import annotations

from typing import Any

from registry.answers import catalog, registration
from registry.core.errors import InputError
from registry.core.store import Store
from registry.data.formats import eee_write, importer, readers
from registry.usecases import onboard as onboard_uc
from registry.usecases import register as register_uc

ExportResult = eee_write.ExportResult


def reader_for(paths: list[str]) -> str:
    """The name of the one reader that recognises `paths` (InputError if none does, or several do)."""
    if not paths:
        raise InputError("give the files or folders to import")
    return readers.detect(list(paths)).name


def import_paths(store: Store, paths: list[str], reader: str | None = None, *, min_evaluations: int,
                 probation: int | None, progress: bool = False, **options: Any) -> importer.HarnessImport:
    """Read `paths` with `reader` (None: the one that recognises them; `detected` says so), then write them in one
    transaction, onboard, and report per model as `register` does (`probation`: the minimum set, None: the data's).
    The CSV folder has its own import (`Registry.import_files`): named here, it is an InputError saying so."""
    if not paths:
        raise InputError(f"give the {reader or ''} files to import".replace("  ", " "))
    name = reader or reader_for(paths)
    if readers.get(name).read is None:
        raise InputError(f"{', '.join(paths)}: a {name} folder: import it with `registry import FOLDER` "
                         f"(Registry.import_files)")
    runs = importer.read_runs(name, list(paths), progress=progress, **options)
    onboard_uc.finish_pending(store, min_evaluations)
    with store.tx() as tx:
        done = importer.write(tx, runs, name, progress=progress)
        names = set(catalog.names(tx))
        for run in runs:            # (the aliases the files record, as the registry that wrote them had them)
            target = (run.meta or {}).get("alias_of")
            if target in names and run.model in names and target != run.model:
                catalog.set_alias(tx, run.model, target, "import")
    outcomes = {o.model: o for o in onboard_uc.onboard(store, min_evaluations)}
    for m in done.models:
        m.outcome = outcomes.get(m.model)
        staged = registration.Staged(m.model, {}, m.evaluations_added, m.queries_added, 0)
        m.report = register_uc.report(store, staged, m.outcome, probation=probation)
    done.detected = reader is None
    return done


def export_eee(store: Store, directory: str, *, models: list[str] | None = None, source: str | None = None,
               progress: bool = False) -> ExportResult:
    """Every (or each named) model's current evaluations as EEE files under `directory`, in one read transaction."""
    with store.tx() as tx:
        return eee_write.export(tx, directory, models=list(models) if models else None, source=source,
                                progress=progress)

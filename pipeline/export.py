"""`mempipe export`: a stage's tables as plain Parquet files with a short README."""

from __future__ import annotations

from pathlib import Path

from pipeline import storage
from pipeline.artifacts import StageDir, atomic_write_parquet
from pipeline.errors import PipelineError


def export_stage(sd: StageDir, out: Path) -> Path:
    manifest = sd.manifest()
    if manifest is None:
        raise PipelineError(f"stage {sd.stage!r} has no finished artifacts under {sd.run_dir}; run it first")
    out.mkdir(parents=True, exist_ok=True)
    lines = [f"# {sd.stage} tables", "", f"Exported from run `{storage.name_of(sd.run_dir)}`, stage fingerprint "
             f"`{manifest.fingerprint}` (mempipe {manifest.code_version}).", ""]
    for table in manifest.tables:
        data = sd.read_table(table)
        target = out / f"{table}.parquet"
        atomic_write_parquet(target, data)
        lines.append(f"## {table}.parquet ({data.num_rows} rows)")
        lines.append("")
        lines += [f"- `{f.name}`: {f.type}" for f in data.schema]
        lines.append("")
    (out / "README.md").write_text("\n".join(lines))
    return out

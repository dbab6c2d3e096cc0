"""`mempipe export teabag --out DIR`: the TeaBag dataset as Parquet tables with a dataset card.

The card is rendered from what the run recorded (`SETTINGS_FILE` in the stage folder: the section,
the generator's and summariser's model, temperature and seed), never from the export command's
config; an export config whose teabag fingerprint differs from the run's manifest is refused (or,
asked for, warned about), since its values would not be the ones the data was made with. Rows are
sorted and the card holds no clock time, so exporting the same run twice, or generating again with
the same config and cache, gives the same bytes.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path, PurePosixPath
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.artifacts import StageDir, atomic_write_bytes, atomic_write_parquet
from pipeline.config import RunConfig
from pipeline.errors import PipelineError
from pipeline.hashing import canonical_json, sha256
from pipeline.manifest import Manifest
from pipeline.storage import Location, join
from stages.teabag.stage import SETTINGS_FILE, TeabagConfig, TeabagStage

log = logging.getLogger(__name__)

FIELDS = {
    "episodes": "the source episodes as of session N: `n_sessions` = N; `notes` of sessions 1..N only (a note "
                "with no session is left out); `personas` only where the source episode ends at session N (null "
                "where it goes on: a corpus's personas describe its last session); `source_file` the file's name only",
    "sessions": "turns of sessions 1..N of each episode, as in the source corpus",
    "questions": "one counterfactual question per row: `asker` asks it of `answerer`; `false_premise` is what it "
                 "wrongly takes for granted; `answer` is what a partner who remembers says; `evidence_sessions` "
                 "are the sessions whose summaries show the truth; `checked` is the counterfactual check's verdict "
                 "(null with the check off); `session_attempts` counts the sessions N+1 written for it and `leak_checked` "
                 "is the leak check's verdict on the one used (null with the check off); `model`, "
                 "`prompt_fingerprint`, `seed` made it",
    "next_sessions": "session N+1 for each question: turns leading to it, the two speakers alternating from the "
                     "asker, the last turn (`is_question`) being the question itself spoken by the asker",
    "rejects": "tries of the exported questions that the counterfactual check rejected, with its reason (kept, "
               "never used; the tries of a question that was never accepted are not exported)",
    "summaries": "step (1): the notes of each past session 1..N of the exported episodes (`memories`), which the "
                 "generator read in session order; `model` is the summariser (TeaBag's own role, not the memory "
                 "methods under test)",
    "session_rejects": "sessions N+1 of the exported questions that the leak check rejected because they gave the "
                       "truth away: the `turns` (ending with the question) and the check's `reason` (kept, never used)",
}
SPLIT = "test"  # TeaBag is an evaluation set: every table is one `test` split
DEFAULT_CONFIG = "questions"
LICENSE_NAME = "teabag-academic-non-commercial"  # the card's Licence section says what it allows


def _sorted(table: pa.Table, keys: list[str]) -> pa.Table:
    return table.sort_by([(k, "ascending") for k in keys]) if table.num_rows else table


def file_name(path: str) -> str:
    """The bare name of a source file, whatever its path or URI (a local path never leaves the run)."""
    return PurePosixPath(path.replace("\\", "/")).name


def past_episodes(episodes: pa.Table, past: dict[str, int], last_session: dict[str, int]) -> pa.Table:
    """The source episodes as of their session N (`past`: episode -> N): `n_sessions` = N, the notes
    of sessions 1..N only (a note without a session could be any session's, so it is left out), the
    personas only where the episode has no session after N (`last_session`: its last session in the
    corpus; a corpus's personas describe the episode's last session), and the source file's name."""
    rows = []
    for r in episodes.to_pylist():
        n = past[r["episode_id"]]
        later = max(r["n_sessions"], last_session.get(r["episode_id"], 0)) > n
        notes = None if r["notes"] is None else [x for x in r["notes"]
                                                 if x["session_idx"] is not None and x["session_idx"] <= n]
        rows.append({**r, "n_sessions": n, "notes": notes, "personas": None if later else r["personas"],
                     "source_file": file_name(r["source_file"])})
    return pa.Table.from_pylist(rows, episodes.schema)


def teabag_tables(ingest: StageDir, teabag: StageDir) -> dict[str, pa.Table]:
    """The dataset's tables from a finished run (`ingest`, `teabag`: its StageDirs): usable questions,
    their episodes as of session N and sessions 1..N, their summaries and sessions N+1, and the rejects
    of those questions only."""
    questions = teabag.read_table("questions")
    questions = questions.filter(pc.is_null(questions["error"])).drop_columns(["error"])
    ids = sorted(set(questions["episode_id"].to_pylist()))
    past = dict(zip(questions["episode_id"].to_pylist(), questions["memory_sessions"].to_pylist()))
    episodes = ingest.read_table("episodes", ids) if ids else ingest.read_table("episodes").slice(0, 0)
    turns = ingest.read_table("turns", ids) if ids else ingest.read_table("turns").slice(0, 0)
    last_session: dict[str, int] = {}
    for e, s in zip(turns["episode_id"].to_pylist(), turns["session_idx"].to_pylist()):
        last_session[e] = max(s, last_session.get(e, 0))
    episodes = past_episodes(episodes, past, last_session)
    keep = [past[e] >= s for e, s in zip(turns["episode_id"].to_pylist(), turns["session_idx"].to_pylist())]
    turns = turns.filter(pa.array(keep, pa.bool_()))
    used = pa.array(questions["question_id"].to_pylist(), pa.string())
    sessions = teabag.read_table("sessions")
    sessions = sessions.filter(pc.is_in(sessions["question_id"], used))
    summaries = teabag.read_table("summaries", ids) if ids else teabag.read_table("summaries").slice(0, 0)
    rejects, session_rejects = teabag.read_table("rejects"), teabag.read_table("session_rejects")
    rejects = rejects.filter(pc.is_in(rejects["question_id"], used))
    session_rejects = session_rejects.filter(pc.is_in(session_rejects["question_id"], used))
    return {
        "episodes": _sorted(episodes, ["episode_id"]),
        "sessions": _sorted(turns, ["episode_id", "session_idx", "turn_idx"]),
        "summaries": _sorted(summaries.drop_columns(["error"]), ["episode_id", "session_idx"]),
        "questions": _sorted(questions, ["episode_id", "question_idx"]),
        "next_sessions": _sorted(sessions, ["question_id", "turn_idx"]),
        "rejects": _sorted(rejects, ["question_id", "attempt"]),
        "session_rejects": _sorted(session_rejects, ["question_id", "attempt"]),
    }


def recorded_settings(teabag: StageDir) -> dict[str, Any]:
    """What the run's teabag stage recorded it was made with (`stages.teabag.stage.recorded_settings`)."""
    try:
        return json.loads(teabag.read_file(SETTINGS_FILE))
    except FileNotFoundError:
        raise PipelineError(f"{join(teabag.final, SETTINGS_FILE)} is missing: the teabag stage under {teabag.run_dir} "
                            "recorded no settings (an older version made it, or no episode reached the stage); "
                            "regenerate it with `mempipe run -c CONFIG --force teabag`") from None


def section_fingerprint(section: dict[str, Any]) -> str:
    return sha256(canonical_json(section))[:16]


def check_config(run_dir: Location, manifest: Manifest, recorded: dict[str, Any], config: RunConfig | TeabagConfig,
                 on_mismatch: Literal["error", "warn"] = "error", fingerprint: str | None = None) -> None:
    """Refuse (or warn) when the export config is not the one the run's TeaBag was made with. A whole
    run config is compared by the teabag stage fingerprint (settings, roles, prompts, code, corpus)
    with the manifest's (`fingerprint`: what the runner computes for it, `stages.teabag_fingerprint`);
    a bare teabag section only by its values with the recorded ones."""
    if isinstance(config, RunConfig):
        if fingerprint is None:
            raise ValueError("a whole run config is checked by its teabag stage fingerprint: pass `fingerprint`")
        what, run_fp, export_fp = "teabag stage fingerprint", manifest.fingerprint, fingerprint
    else:
        what = "teabag section fingerprint"
        run_fp = section_fingerprint(recorded["teabag"])
        export_fp = section_fingerprint(config.model_dump(mode="json"))
    if run_fp == export_fp:
        return
    message = (f"the TeaBag under {join(run_dir, TeabagStage.name)} was made with {what} {run_fp}, but the export config "
               f"gives {export_fp}: its card would describe settings the data was not made with. Export with the "
               "config (and --set overrides) the run was made with, or regenerate TeaBag for this config first: "
               "`mempipe run -c CONFIG --until teabag` with the same --set overrides, then export again")
    if on_mismatch == "warn":
        log.warning("%s (the card is rendered from the run's recorded settings)", message)
        return
    raise PipelineError(message)


def _role_line(record: dict[str, Any]) -> str:
    temperature = record.get("temperature")
    return f"`{record.get('model')}` at temperature {'unset' if temperature is None else temperature} " \
           f"(role `{record.get('role')}`)"


def front_matter(tables: dict[str, pa.Table]) -> list[str]:
    """The card's YAML header as the `datasets` library and the Hub read it: a named `other` licence and
    one config per table with rows, `questions` first and the default, each a single `test` split. A
    table without rows is written but not listed: `datasets` cannot load a 0-row Parquet file."""
    lines = ["---", "license: other", f"license_name: {LICENSE_NAME}", "pretty_name: TeaBag"]
    listed = sorted((name for name, table in tables.items() if table.num_rows), key=lambda n: n != DEFAULT_CONFIG)
    if listed:
        lines.append("configs:")
    for name in listed:
        lines += [f"- config_name: {name}", "  data_files:", f"  - split: {SPLIT}", f"    path: {name}.parquet"]
        if name == DEFAULT_CONFIG:
            lines.append("  default: true")
    return [*lines, "---"]


def _how_it_was_made(settings: dict[str, Any], generator: dict[str, Any], summariser: dict[str, Any]) -> list[str]:
    """The card's numbered steps: how the summaries, questions and sessions N+1 were made and checked."""
    return [
        f"1. Each of the past sessions 1..N (N = `teabag.sessions` = {settings['sessions']}) was summarised into at "
        f"most {settings['max_memories']} notes with TeaBag's own summary prompt by TeaBag's own summariser, "
        f"{_role_line(summariser)}"
        + ("" if summariser.get("role") == "teabag_summary" else
           ", the generator's role since `roles.teabag_summary` was not set")
        + "; neither the memory methods' role nor their session-memory prompt was used, so the ground truth is "
        "not the tested methods' own output. The notes are in `summaries.parquet`.",
        "2. The summaries were given to the generator in session order, so it knows the newest stage of each event.",
        f"3. The generator, {_role_line(generator)}, wrote {settings['questions_per_episode']} counterfactual "
        "questions per episode, the two speakers asking in turn, each with the correct answer, the answering "
        "speaker and the evidence sessions.",
        f"4. Counterfactual check (ours, not in the paper): {'on' if settings['counterfactual_check'] else 'off'}"
        + (f"; rejected questions were regenerated up to {settings['max_attempts']} tries and kept in `rejects`."
           if settings['counterfactual_check'] else "."),
        f"5. A new session N+1 (about {settings['session_turns']} turns) was written for each question, the two "
        "speakers alternating from the asker and the answerer speaking last; it ends with the question, spoken by "
        "the asker. The generator was told not to state or hint at the correct answer or the true current state "
        "of the event.",
        f"6. Leak check (ours, not in the paper): {'on' if settings['leak_check'] else 'off'}"
        + (f"; a session N+1 that gave the truth away was written again up to {settings['session_attempts']} "
           "tries and kept in `session_rejects`; a question whose every session leaked was dropped."
           if settings['leak_check'] else "."),
    ]


def _provenance(tables: dict[str, pa.Table], manifest: Manifest, generator: dict[str, Any],
                summariser: dict[str, Any]) -> list[str]:
    """The models, prompt fingerprints, seeds and stage fingerprint the rows were made with."""
    q = tables["questions"]
    models = sorted({m for m in q["model"].to_pylist() if m})
    summary_models = sorted({m for m in tables["summaries"]["model"].to_pylist() if m})
    fingerprints = sorted(set(q["prompt_fingerprint"].to_pylist()))
    seeds = sorted({s for s in q["seed"].to_pylist() if s is not None})
    return [
        f"- generator model(s): {', '.join(models) or 'none'}; temperature: {generator.get('temperature')}",
        f"- summariser model(s): {', '.join(summary_models) or 'none'}; temperature: {summariser.get('temperature')}",
        f"- prompt fingerprint(s): {', '.join(fingerprints) or 'none'}",
        f"- seed(s): {', '.join(map(str, seeds)) or 'none'}",
        f"- stage fingerprint: `{manifest.fingerprint}` (mempipe {manifest.code_version})",
    ]


def _table_sections(tables: dict[str, pa.Table]) -> list[str]:
    """Each table's columns, the licence, and how to load the tables."""
    empty = [name for name, table in tables.items() if not table.num_rows]
    lines: list[str] = []
    for name, table in tables.items():
        lines += [f"### {name}.parquet ({table.num_rows} rows)", "", FIELDS[name], ""]
        lines += [f"- `{f.name}`: {f.type}" for f in table.schema]
        lines.append("")
    lines += [
        "## Licence", "",
        "The source dialogues keep their own licences (MSC and Conversation Chronicles are released for "
        "academic and non-commercial use). TeaBag itself is for academic, non-commercial use, as the Theanine "
        f"paper releases it (`license_name: {LICENSE_NAME}` in the header above).", "",
        "## Loading", "",
        f"Each table with rows is a config of one `{SPLIT}` split; `{DEFAULT_CONFIG}` is the default."
        + (f" Written without rows, so not a config: {', '.join(f'`{n}.parquet`' for n in empty)}." if empty else ""),
        "", "```python",
        "from datasets import load_dataset",
        f"questions = load_dataset('DIR', split='{SPLIT}')  # DIR: this folder",
        f"sessions = load_dataset('DIR', 'sessions', split='{SPLIT}')",
        "# or: polars.read_parquet('DIR/questions.parquet')", "```", "",
    ]
    return lines


def dataset_card(tables: dict[str, pa.Table], manifest: Manifest, recorded: dict[str, Any]) -> str:
    """The card, from the run's recorded settings (`recorded`) and its manifest, never a live config."""
    settings = recorded["teabag"]
    generator, summariser = recorded["generator"], recorded["summariser"]
    q = tables["questions"]
    datasets = q["dataset"].to_pylist()
    per_dataset = ", ".join(f"{d}: {datasets.count(d)}" for d in sorted(set(datasets))) or "none"
    lines = [
        *front_matter(tables), "", "# TeaBag", "",
        "Counterfactual questions for testing whether a dialogue system remembers a long conversation "
        "(TeaFarm, Theanine paper, Sec. 5 and App. C), generated by mempipe's `teabag` stage.", "",
        "## Counts", "",
        f"- episodes: {tables['episodes'].num_rows}; questions: {q.num_rows} ({per_dataset}); "
        f"session N+1 turns: {tables['next_sessions'].num_rows}; rejected tries of these questions: "
        f"{tables['rejects'].num_rows}; their leaking sessions N+1: {tables['session_rejects'].num_rows}",
        "", "## How it was made", "",
        *_how_it_was_made(settings, generator, summariser),
        "",
        "The checks run on the generator's model at temperature 0.", "",
        *_provenance(tables, manifest, generator, summariser), "",
        "## Tables", "",
    ]
    return "\n".join([*lines, *_table_sections(tables)])


def export_teabag(run_dir: Location, out: Path, config: RunConfig | TeabagConfig,
                  on_mismatch: Literal["error", "warn"] = "error", fingerprint: str | None = None) -> Path:
    """Write the TeaBag dataset of `run_dir` into `out`: the tables and a card rendered from the run's
    recorded settings. `config` is the export command's config (a whole run config is checked by the
    stage fingerprint, a bare teabag section by its values); a mismatch raises PipelineError, or
    only logs a warning with `on_mismatch="warn"`; `fingerprint`: the run config's teabag stage
    fingerprint as the runner computes it (`stages.teabag_fingerprint`)."""
    ingest, teabag = StageDir(run_dir, "ingest"), StageDir(run_dir, "teabag")
    manifest = teabag.manifest()
    if manifest is None or ingest.manifest() is None:
        raise PipelineError(f"no finished teabag stage under {run_dir}; run it first (teabag.enabled=true)")
    recorded = recorded_settings(teabag)
    check_config(run_dir, manifest, recorded, config, on_mismatch, fingerprint)
    return write_dataset(out, teabag_tables(ingest, teabag), manifest, recorded)


def write_dataset(out: Path, tables: dict[str, pa.Table], manifest: Manifest, recorded: dict[str, Any]) -> Path:
    """Every table as `<name>.parquet` (a table without rows too) and the card as `README.md` in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    for name, table in tables.items():
        atomic_write_parquet(out / f"{name}.parquet", table)
    atomic_write_bytes(out / "README.md", dataset_card(tables, manifest, recorded).encode())
    return out

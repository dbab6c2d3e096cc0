"""Memory accuracy (RSum, seed 002, Section 6 and Table 2): each method's generated memory scored
against the corpus's gold memory, MSC's per-session persona summaries.

RSum's "Session k" row scores the memory a response in session k reads, the memory after session
k-1, against the gold memory of the same point: the persona summaries of sessions 1..k-1
(MSC's `previous_dialogs[j].personas`, which ingest keeps as the "persona" notes of session j+1; a
line repeated by a later summary counted once, as gold memory shows it). A method's memory at a
point is its `memory_view` of the rows visible there (`visible_memory`), so every method with memory
tables is scored the same way: RSum's summary, the memory pools, CREEM's and mem0_style's stores.
Only points the gold covers (a session with persona summaries at or before it) are scored; a corpus
without per-session summaries gives no rows.

Table 2's columns, by RSum's scorer:
- Prec. / Recall / Mem_F1 (`rsum_precision`, `rsum_recall`, `rsum_mem_f1`): what RSum's
  main_chatgpt.py logs as `compute_f1(mem_preds, mem_labels)`, the per-pair parts of
  `stages/metrics/rsum_eval.py`'s `f1_parts` averaged over the episodes (a 95% bootstrap interval on
  Mem_F1).
- BLEU-1 / BLEU-2 (`evaluate_precision1`, `evaluate_precision2`): HF evaluate's clipped corpus
  n-gram precisions over the episodes' memories, the statistic RSum's Table 1 BLEU-1/2 come from.
  RSum's ChatGPT script, which wrote Table 2, logs no memory BLEU. Its llama script's
  `evaluate_memory` does (nltk `corpus_bleu`, smoothing method7), but that figure is unusable: each
  gold memory's token list is passed where nltk expects a list of references, so every gold token
  becomes a reference of its own and only one-character words can match (clipped against the
  characters of gold words), and its "BLEU1" / "BLEU2" are the cumulative weights (1/2, 1/2) and
  (1/3, 1/3, 1/3), i.e. BLEU-2 and BLEU-3. So Table 2's BLEU-1/2 are taken as Table 1's are.
- `bleu1` / `bleu2`: ours, the mean of nltk sentence BLEU-1/2 (`stages/metrics/text.py`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import polars as pl
import pyarrow as pa

from pipeline.retrieval import count_tokens
from stages.methods.base import EpisodeInput, Method, visible_memory
from stages.metrics.evaluate_bleu import ngram_precisions
from stages.metrics.rsum_eval import f1_parts
from stages.metrics.significance import bootstrap_mean_interval
from stages.metrics.text import bleu
from stages.report.frames import as_float, from_table

PRECISION_ORDERS = (1, 2)  # Table 2's BLEU-1/2

MEMORY_ACCURACY = pa.schema([
    pa.field("dataset", pa.string()),
    pa.field("method", pa.string()),
    pa.field("session_idx", pa.int32()),  # RSum's "Session k": the memory used in session k
    pa.field("memory_after_session", pa.int32()),  # = k - 1
    pa.field("episodes", pa.int64()),
    pa.field("rsum_precision", pa.float64()),  # RSum's compute_f1: Prec.
    pa.field("rsum_recall", pa.float64()),  # ... Recall
    pa.field("rsum_mem_f1", pa.float64()),  # ... Mem_F1
    pa.field("rsum_mem_f1_low", pa.float64()),
    pa.field("rsum_mem_f1_high", pa.float64()),
    *[pa.field(f"evaluate_precision{n}", pa.float64()) for n in PRECISION_ORDERS],  # BLEU-1/2 as Table 1's
    pa.field("bleu1", pa.float64()),  # ours: mean nltk sentence BLEU-1
    pa.field("bleu2", pa.float64()),
    pa.field("memory_tokens", pa.float64()),  # mean cl100k tokens of the generated memory
    pa.field("gold_tokens", pa.float64()),  # ... of the gold memory (RSum: ~70 in early sessions)
])

# Which scorer computes each score column of MEMORY_ACCURACY (as response_metrics.COLUMN_SCORERS).
_F1 = ("RSum's scorer (Table 2 {}): utils/evaluation.py compute_f1(mem_preds, mem_labels) {} on nltk word_tokenize "
       "tokens of the normalised texts (punctuation -> space, a/an/the removed); mean over episodes")
MEMORY_SCORERS: dict[str, str] = {
    "rsum_precision": _F1.format("Prec.", "precision"),
    "rsum_recall": _F1.format("Recall", "recall"),
    "rsum_mem_f1": _F1.format("Mem_F1", "F1") + "; _low/_high a 95% bootstrap interval",
    **{f"evaluate_precision{n}": f"RSum's scorer as Table 1's BLEU-{n} (its ChatGPT script logs no memory BLEU; "
                                 f"its llama script's is unusable): HF evaluate bleu precisions[{n - 1}] = sacrebleu "
                                 f"clipped corpus {n}-gram precision over the episodes' memories, 13a tokens, case kept"
       for n in PRECISION_ORDERS},
    **{f"bleu{n}": f"ours: nltk sentence BLEU-{n} (smoothing method1, lowercased regex tokens), mean over episodes"
       for n in (1, 2)},
    "memory_tokens": "ours: mean cl100k tokens of the generated memory",
    "gold_tokens": "ours: mean cl100k tokens of the gold memory",
}


def gold_persona_memory(episode: Mapping[str, Any], upto_session: int) -> str | None:
    """The gold memory after `upto_session`: its persona summary lines and earlier ones, in order,
    each line once; None when no session up to it has a summary."""
    lines: list[str] = []
    for note in episode.get("notes") or []:
        if note["kind"] == "persona" and note["session_idx"] <= upto_session and note["text"] not in lines:
            lines.append(note["text"])
    return "\n".join(lines) or None


def memory_points(episode: Mapping[str, Any]) -> list[int]:
    """The sessions after which the gold memory can be compared: 1 .. the last summarised session."""
    summarised = [n["session_idx"] for n in episode.get("notes") or [] if n["kind"] == "persona"]
    return list(range(1, max(summarised) + 1)) if summarised else []


def memory_at(method: Method, episode: Mapping[str, Any], tables: Mapping[str, list[dict]], session: int,
              settings: Any) -> str | None:
    """The method's memory as built up to the end of `session` (what session + 1 reads), as text."""
    visible = {t: visible_memory(rows, session + 1, 0, method.memory_kind) for t, rows in tables.items()}
    view = EpisodeInput(episode=dict(episode), sessions={s: [] for s in range(1, session + 1)})
    return method.memory_view(view, visible, settings)


def memory_accuracy_rows(methods: Sequence[tuple[Method, Any]], episodes: Sequence[Mapping[str, Any]],
                         memory: Mapping[str, Mapping[str, list[dict]]]) -> list[dict[str, Any]]:
    """One row per (episode, method, session k) with the memory after k-1 and the gold of that point:
    the texts and their Table 2 scores. `methods`: (method, its settings); `memory`: method name ->
    table -> rows of every episode."""
    rows = []
    for ep in episodes:
        points = memory_points(ep)
        for method, settings in methods:
            tables = {t: [r for r in rs if r["episode_id"] == ep["episode_id"]]
                      for t, rs in memory.get(method.name, {}).items()}
            if not any(tables.values()):
                continue
            for s in points:
                gold, built = gold_persona_memory(ep, s), memory_at(method, ep, tables, s, settings)
                if gold is None or built is None:  # nothing built yet: no memory to score
                    continue
                p, r, f1 = f1_parts(built, gold)
                rows.append({"dataset": ep.get("dataset") or "", "episode_id": ep["episode_id"],
                             "method": method.name, "session_idx": s + 1, "memory_after_session": s,
                             "memory": built, "gold": gold, "rsum_precision": p, "rsum_recall": r,
                             "rsum_mem_f1": f1,
                             "bleu1": bleu(built, gold, 1), "bleu2": bleu(built, gold, 2),
                             "memory_tokens": count_tokens(built), "gold_tokens": count_tokens(gold)})
    return rows


def memory_accuracy_summary(rows: Sequence[Mapping[str, Any]]) -> pl.DataFrame:
    """MEMORY_ACCURACY: per dataset, method and session, the means over episodes (a 95% bootstrap
    interval on RSum's Mem_F1) and evaluate's n-gram precisions over the episodes' memories."""
    if not rows:
        return from_table(MEMORY_ACCURACY.empty_table())
    out = []
    df = pl.DataFrame(list(rows))
    means = ("rsum_precision", "rsum_recall", "rsum_mem_f1", "bleu1", "bleu2", "memory_tokens", "gold_tokens")
    for (dataset, method, session), g in df.group_by(["dataset", "method", "session_idx"], maintain_order=True):
        low, high = bootstrap_mean_interval(g["rsum_mem_f1"].to_list())
        precisions: Sequence[float | None] = (ngram_precisions(g["memory"].to_list(), g["gold"].to_list())
                                              or [None] * len(PRECISION_ORDERS))
        out.append({"dataset": dataset, "method": method, "session_idx": session,
                    "memory_after_session": session - 1, "episodes": g.height,
                    **{c: as_float(g[c].mean()) for c in means},
                    "rsum_mem_f1_low": low, "rsum_mem_f1_high": high,
                    **{f"evaluate_precision{n}": precisions[n - 1] for n in PRECISION_ORDERS}})
    table = pa.Table.from_pylist(out, MEMORY_ACCURACY)
    return from_table(table).sort(["dataset", "method", "session_idx"])

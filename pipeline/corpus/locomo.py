"""LoCoMo (locomo10.json): a list of samples with conversation.session_<n> (+ session_<n>_date_time) and qa."""

from __future__ import annotations

import re

from pipeline.corpus.reader import RawRecord
from pipeline.corpus.records import Checker, Episode, Note, QAItem, Session, Turn, join

DATASET = "locomo"
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
_SESSION_RE = re.compile(r"^session_(\d+)$")
_PACKED = re.compile(r"[;,\s]+")  # a few evidence entries pack several ids: "D8:6; D9:17"


def parse(rec: RawRecord, chk: Checker, captions: bool = True) -> Episode:
    """One LoCoMo sample. captions: a shared photo's BLIP caption appended to its turn's text
    (`corpus.captions`; SeCom's Table 6 token counts fit LoCoMo's text without them)."""
    d = chk.obj(rec.data, "")
    episode_id = f"{DATASET}-{chk.ident(d, 'sample_id')}"
    chk.name(episode_id)
    conv = chk.req(d, "conversation", dict)
    speakers = [chk.req(conv, "speaker_a", str, "conversation"), chk.req(conv, "speaker_b", str, "conversation")]

    keys: dict[int, str] = {}
    for key in conv:
        m = _SESSION_RE.match(key)
        if not m:
            continue
        n = int(m[1])
        if n < 1:
            chk.fail(join("conversation", key), "session numbers start at 1")
        if n in keys:
            chk.fail(join("conversation", key), f"session {n} is given twice (also as {keys[n]!r})")
        keys[n] = key
    if not keys:
        chk.fail("conversation.session_1", "conversation has no sessions")
    sessions = []
    for expected, n in enumerate(sorted(keys), start=1):
        if n != expected:
            chk.fail(f"conversation.session_{expected}", f"session {expected} is missing but session {n} exists")
        at = join("conversation", keys[n])
        turns = []
        for i, raw in enumerate(chk.check(conv[keys[n]], list, at)):
            t_at = join(at, i)
            t = chk.obj(raw, t_at)
            text = chk.req(t, "text", str, t_at)
            caption = chk.opt(t, "blip_caption", str, t_at)
            if caption and captions:
                # The shared photo carries content that questions ask about.
                text = f"{text} [shares {caption}]"
            turns.append(
                Turn(
                    speaker=chk.req(t, "speaker", str, t_at),
                    text=text,
                    path=t_at,
                    source_turn_id=chk.opt(t, "dia_id", str, t_at),
                )
            )
        time_key = f"{keys[n]}_date_time"
        when = chk.time(conv.get(time_key), join("conversation", time_key))
        sessions.append(Session(turns, at, time=when, notes=_notes(d, n, chk)))

    return Episode(
        episode_id=episode_id,
        dataset=DATASET,
        sessions=sessions,
        speakers=speakers,
        qa=_qa(d, episode_id, chk),
        sessions_path="conversation",
        id_field="sample_id",
    )


def _qa(d: dict, episode_id: str, chk: Checker) -> list[QAItem]:
    items = []
    for i, raw in enumerate(chk.opt(d, "qa", list, default=[])):
        at = join("qa", i)
        q = chk.obj(raw, at)
        category = chk.req(q, "category", int, at)
        if category not in CATEGORIES:
            chk.fail(join(at, "category"), f"unknown category {category} (known: {sorted(CATEGORIES)})")
        # Adversarial questions carry "adversarial_answer", the tempting wrong answer, instead of
        # "answer": the right response is that the conversation does not say, so answer stays null.
        answer = chk.opt(q, "answer", (str, int, float), at)
        wrong = chk.opt(q, "adversarial_answer", (str, int, float), at)
        evidence = q.get("evidence")
        items.append(
            QAItem(
                qa_id=f"{episode_id}-q{i}",
                question=chk.req(q, "question", str, at),
                answer=None if answer is None else str(answer),
                evidence=[] if evidence is None else _evidence_ids(chk.str_list(evidence, join(at, "evidence"))),
                category=CATEGORIES[category],
                path=at,
                adversarial_answer=None if wrong is None else str(wrong),
            )
        )
    return items


def _evidence_ids(evidence: list[str]) -> list[str]:
    """Dialogue ids, one per entry: packed entries ("D8:6; D9:17") split (ids naming no turn are
    dropped later, in build_rows)."""
    return [part for item in evidence for part in _PACKED.split(item) if part]


def _notes(d: dict, n: int, chk: Checker) -> list[Note]:
    """Session n's annotations: `session_summary.session_<n>_summary` (text) and
    `observation.session_<n>_observation` ({speaker: [[text, evidence], ...]})."""
    notes = []
    summaries = chk.opt(d, "session_summary", dict, default={})
    key = f"session_{n}_summary"
    if key in summaries:
        notes.append(Note("summary", chk.check(summaries[key], str, join("session_summary", key))))
    observations = chk.opt(d, "observation", dict, default={})
    key = f"session_{n}_observation"
    if key in observations:
        at = join("observation", key)
        for speaker, items in chk.check(observations[key], dict, at).items():
            chk.text(speaker, at)  # the speaker name is a key: it becomes the note's speaker
            for i, item in enumerate(chk.check(items, list, join(at, speaker))):
                text = item[0] if isinstance(item, list) and item else item
                notes.append(Note("observation", chk.check(text, str, join(join(at, speaker), i)), speaker))
    return notes

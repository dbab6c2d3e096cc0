"""The project's own format: JSONL, one episode per line (see README / SPEC)."""

from __future__ import annotations

from pipeline.corpus.reader import RawRecord
from pipeline.corpus.records import Checker, Episode, QAItem, Session, Turn, join, shown

DATASET = "sample"


def parse(rec: RawRecord, chk: Checker) -> Episode:
    d = chk.obj(rec.data, "")
    episode_id = chk.ident(d, "episode_id")
    chk.name(episode_id)
    speakers = chk.str_list(chk.req(d, "speakers", list), "speakers")
    if not speakers:
        chk.fail("speakers", "must name at least one speaker")
    if len(set(speakers)) != len(speakers):
        chk.fail("speakers", f"names a speaker twice: {shown(speakers)}")

    personas = chk.opt(d, "personas", dict)
    if personas is not None:
        for name, lines in personas.items():
            chk.str_list(lines, join("personas", name))

    sessions = []
    for i, raw in enumerate(chk.req(d, "sessions", list)):
        at = join("sessions", i)
        s = chk.obj(raw, at)
        turns = []
        for j, raw_turn in enumerate(chk.req(s, "turns", list, at)):
            t_at = join(join(at, "turns"), j)
            t = chk.obj(raw_turn, t_at)
            turns.append(
                Turn(
                    speaker=chk.req(t, "speaker", str, t_at),
                    text=chk.req(t, "text", str, t_at),
                    path=t_at,
                    topic_start=chk.opt(t, "topic_start", bool, t_at),
                )
            )
        sessions.append(
            Session(turns, at, time=chk.time(s.get("time"), join(at, "time")), gap=chk.opt(s, "gap", str, at))
        )

    qa = []
    for i, raw in enumerate(chk.opt(d, "qa", list, default=[])):
        at = join("qa", i)
        q = chk.obj(raw, at)
        evidence = q.get("evidence")
        qa.append(
            QAItem(
                qa_id=chk.ident(q, "qa_id", at) if q.get("qa_id") is not None else f"{episode_id}-q{i}",
                question=chk.req(q, "question", str, at),
                answer=chk.opt(q, "answer", str, at),
                evidence=[] if evidence is None else chk.str_list(evidence, join(at, "evidence")),
                category=chk.opt(q, "category", str, at),
                path=at,
            )
        )

    return Episode(
        episode_id=episode_id,
        dataset=DATASET,
        sessions=sessions,
        speakers=speakers,
        personas=personas,
        relationship=chk.opt(d, "relationship", str),
        qa=qa,
    )

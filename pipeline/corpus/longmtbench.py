"""Long-MT-Bench+: records of user/assistant sessions plus question/answer lists about them."""

from __future__ import annotations

from pipeline.corpus.reader import RawRecord
from pipeline.corpus.records import Checker, Episode, QAItem, Session, Turn, join

DATASET = "longmtbench"
SPEAKERS = ["user", "assistant"]


def parse(rec: RawRecord, chk: Checker) -> Episode:
    d = chk.obj(rec.data, "")
    source_id = chk.ident(d, "id") if d.get("id") is not None else f"{rec.file.stem}-{rec.index}"
    episode_id = f"{DATASET}-{source_id}"
    chk.name(episode_id)

    sessions = []
    for i, raw in enumerate(chk.req(d, "sessions", list)):
        at = join("sessions", i)
        turns = []
        for j, raw_turn in enumerate(chk.check(raw, list, at)):
            t_at = join(at, j)
            t = chk.obj(raw_turn, t_at)
            turns.append(Turn(speaker=chk.req(t, "role", str, t_at), text=chk.req(t, "content", str, t_at), path=t_at))
        sessions.append(Session(turns, at))
    for s in sessions:
        for t in s.turns:
            if t.speaker not in SPEAKERS:
                chk.fail(join(t.path, "role"), f"role {t.speaker!r} is not one of {SPEAKERS}")

    questions = chk.str_list(chk.req(d, "questions", list), "questions")
    answers = chk.req(d, "answers", list)
    for i, a in enumerate(answers):
        chk.check(a, (str, int, float), join("answers", i))
    if len(answers) != len(questions):
        chk.fail("answers", f"{len(answers)} answers for {len(questions)} questions")
    qa = [
        # The dataset gives no evidence turns: null, not an empty list.
        QAItem(f"{episode_id}-q{i}", q, str(a), None, None, join("questions", i))
        for i, (q, a) in enumerate(zip(questions, answers))
    ]
    return Episode(episode_id=episode_id, dataset=DATASET, sessions=sessions, speakers=SPEAKERS, qa=qa)

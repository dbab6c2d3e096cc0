"""What the judge tests of the newer benchmarks share: one episode through `judge_answers` with a fake
judge, its QA rows carrying the judges' notes (a rubric, a question type, key points)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from types import SimpleNamespace

from pipeline.engine.stage import StageContext
from pipeline.testing.fake_chat import FakeChat
from stages.judging.judge_answers import JudgeAnswersSettings, JudgeAnswersStage


def judge_episode(llm: FakeChat, judge: str, dataset: str, probes: Sequence[dict], answers: Mapping[str, str],
                  notes: Mapping[str, list[str] | None], *, model: str, runs: int = 1,
                  temperature: float = 0.0) -> list[dict]:
    """The `answer_judgments` rows of one episode whose zero_history answers are `answers` (by probe id),
    judged by `judge` alone; `notes` are each question's judge notes (by qa id)."""
    settings = JudgeAnswersSettings(correctness=[judge], score_0_100=False, runs=runs, max_tokens=10,
                                    temperature=temperature)
    inputs = {"ingest.episodes": [{"episode_id": "e", "dataset": dataset}], "ingest.turns": [],
              "ingest.qa": [{"qa_id": p["qa_id"], "question": f"Question {p['qa_id']}?",
                             "judge_notes": notes[p["qa_id"]]} for p in probes],
              "probes.probes": list(probes),
              "respond_zero_history.responses": [{"probe_id": k, "response": v, "error": None}
                                                 for k, v in answers.items()]}
    stage = JudgeAnswersStage(("zero_history",))
    llm.cfg = SimpleNamespace(model=model)  # type: ignore[attr-defined]
    ctx = StageContext(cfg=SimpleNamespace(judge_answers=settings, corpus=SimpleNamespace(answer_key="original")),
                       stage=stage, out_dir=None,  # type: ignore[arg-type]
                       clients={"judge": llm})
    return asyncio.run(stage.process_episode(ctx, "e", inputs))["answer_judgments"]

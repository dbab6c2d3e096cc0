"""TeaBag (Theanine Section 5): counterfactual questions generated from each episode's sessions for
TeaFarm. The stage is in `stage.py`, the generation (pure) in `generate.py`, the dataset export in
`export.py`."""

from stages.teabag.stage import (GENERATOR_ROLE, QUESTIONS, REJECTS, SESSIONS, SESSION_REJECTS, SETTINGS_FILE,
                                 SUMMARIES, SUMMARY_ROLE, TeabagConfig, TeabagStage)

__all__ = ["GENERATOR_ROLE", "QUESTIONS", "REJECTS", "SESSIONS", "SESSION_REJECTS", "SETTINGS_FILE", "SUMMARIES",
           "SUMMARY_ROLE", "TeabagConfig", "TeabagStage"]

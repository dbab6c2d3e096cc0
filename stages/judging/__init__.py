"""Judging: LLM judges over the responses of every method of a run (the `judge` role).

Where each judge lives (the pure judge beside the stage that runs it):
- `pairwise.py`, run by `judge_pairwise.py`: G-Eval head-to-head of two responses on one criterion
  (Theanine App. D; SeCom App. A.4's both-orders protocol; CREEM App. B.1's protocol as a mode);
- `answers.py`, run by `judge_answers.py`: a single answer against its reference: 0-100 (SeCom's
  GPT4Score), correct / incorrect in a strict and a lenient wording, TeaFarm correctness;
- `memory_quality.py`, run by `judge_memory.py`: a method's memory of an episode, 1-5 on CREEM's
  seven criteria (App. B.2);
- `calibration.py`, run by `judge_calibration.py`: answers built from the gold whose verdict is known
  (the gold, longer, a checked paraphrase; a shifted date, a swapped name, a changed number, vague,
  "not mentioned", negated), each answer judge's false accepts and false rejects per kind;
- `base.py`: what the judge stages share (settings, the role, the stamp on every row).
"""

"""Scoring stages: `score` (retrieval, segmentation and QA measures per run) and `response_metrics`
(per-response scores, each column from a scorer of `stages.report.scorers`)."""

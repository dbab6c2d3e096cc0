"""report: summary tables (Parquet) and `report.md` + `report.html` with plots: every method's
cost beside its quality, judge win rates with p-values, answer judges, reference metrics per
dataset and category, memory quality, segmentation and retrieval, the run beside the papers it
reproduces or is compared with (`paper:` sheets), why wrong answers failed (write, retrieval or
read: the `diagnose` stage's buckets), and the per-probe rows.

The stage is in `stage.py`, its sections in `sections.py`, the per-probe views in `per_probe.py`
and the summary tables in `tables.py` (which names the module of each)."""

from stages.report.per_probe import probe_browser_data, probe_rows, teabag_rows
from stages.report.reproduction import compared_sheets, reproduction_section, run_sheets
from stages.report.stage import REPORT_HTML, REPORT_MD, ReportSettings, ReportStage, stage_usage

__all__ = ["REPORT_HTML", "REPORT_MD", "ReportSettings", "ReportStage", "compared_sheets", "probe_browser_data",
           "probe_rows", "reproduction_section", "run_sheets", "stage_usage", "teabag_rows"]

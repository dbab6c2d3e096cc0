"""The report as Markdown and as one HTML page: a leaderboard, sections of tables and figures, the
win-rate heat maps, and a per-probe browser (static HTML + inline JS over an inline JSON blob).
Pure rendering from summary frames; no I/O but what the caller writes."""

from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass, field
from typing import Any, TypeGuard

import polars as pl

COLLAPSE_ROWS = 12  # tables longer than this start folded (<details>)


@dataclass
class Section:
    title: str
    intro: str = ""
    tables: list[tuple[str, pl.DataFrame]] = field(default_factory=list)  # (caption, frame)
    figures: list[tuple[str, str]] = field(default_factory=list)  # (file name, alt text)
    # (caption, cell texts, win shares): a heat map in HTML, a plain table in Markdown; shown before `tables`
    matrices: list[tuple[str, pl.DataFrame, pl.DataFrame]] = field(default_factory=list)
    table_class: str = ""  # the HTML class of its tables ("leaderboard": large type, no wrapping)


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return "n/a" if v != v else f"{v:.3g}" if abs(v) < 1e-3 and v != 0 else f"{v:.3f}"
    if isinstance(v, (list, tuple)):
        return ", ".join(map(str, v))
    return str(v)


def markdown_table(df: pl.DataFrame) -> str:
    if df.is_empty():
        return "_no rows_\n"
    lines = ["| " + " | ".join(df.columns) + " |", "|" + "---|" * len(df.columns)]
    for row in df.iter_rows():
        lines.append("| " + " | ".join(_cell(v).replace("|", "\\|").replace("\n", " ") for v in row) + " |")
    return "\n".join(lines) + "\n"


def html_table(df: pl.DataFrame, cls: str = "", caption: str = "", fold: bool = True) -> str:
    """A table in a horizontally scrollable box; folded under its caption when it is long (and `fold`)."""
    if df.is_empty():
        return (f"<h3>{html.escape(caption)}</h3>" if caption else "") + "<p class='none'>no rows</p>"
    head = "".join(f"<th>{html.escape(c)}</th>" for c in df.columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_cell(v))}</td>" for v in row) + "</tr>"
                   for row in df.iter_rows())
    table = f"<div class='scroll'><table class='{cls}'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>"
    if fold and df.height > COLLAPSE_ROWS:
        label = html.escape(caption or "Full table")
        return f"<details><summary>{label} ({df.height} rows, {df.width} columns)</summary>{table}</details>"
    return (f"<h3>{html.escape(caption)}</h3>" if caption else "") + table


# ---- leaderboard -------------------------------------------------------------------------------

def _overall(df: pl.DataFrame) -> str | None:
    """The dataset whose rows stand for the whole run: `all` when pooled, else the only one."""
    if df.is_empty() or "dataset" not in df.columns:
        return None
    names = set(df["dataset"].drop_nulls().to_list())
    return "all" if "all" in names else next(iter(names)) if len(names) == 1 else None


def _present(v: float | None) -> TypeGuard[float]:
    """A value a cell shows: neither null nor NaN."""
    return v is not None and not math.isnan(v)


def _counts(n: int | None, episodes: int | None) -> str:
    return (f" n={n}" if n is not None else "") + (f" ep={episodes}" if episodes is not None else "")


def _share(v: float | None, low: float | None, high: float | None, n: int | None,
           episodes: int | None = None) -> str:
    """A share's cell: "62% [41–80] n=200 ep=10" (no interval with one episode)."""
    if not _present(v):
        return ""
    ci = f" [{low * 100:.0f}–{high * 100:.0f}]" if _present(low) and _present(high) else ""
    return f"{v * 100:.0f}%{ci}" + _counts(n, episodes)


def _mean(v: float | None, low: float | None, high: float | None, n: int | None, fmt: str,
          episodes: int | None = None) -> str:
    """A mean's cell: "70.0 [60.0–80.0] n=40 ep=10"."""
    if not _present(v):
        return ""
    ci = f" [{low:{fmt}}–{high:{fmt}}]" if _present(low) and _present(high) else ""
    return f"{v:{fmt}}{ci}" + _counts(n, episodes)


def _get(r: dict[str, Any], col: str) -> Any:
    return r.get(col)  # a column an older table lacks reads as missing


def _with_failed(cell: str, r: dict[str, Any]) -> str:
    """A leaderboard cell with the row's failed items named ("0% n=3 ep=1 failed=1"); a cell with no
    value left for its failures says only that ("failed=1"), never a bare blank."""
    failed = _get(r, "failed")
    if not failed:
        return cell
    return f"{cell} failed={failed}" if cell else f"failed={failed}"


def leaderboard(methods: pl.DataFrame, answers: pl.DataFrame, teafarm: pl.DataFrame, metrics: pl.DataFrame,
                pairwise: pl.DataFrame, wins: pl.DataFrame | None = None,
                robust: pl.DataFrame | None = None, calibration: pl.DataFrame | None = None) -> pl.DataFrame:
    """Method x headline metric over the whole run, each cell "value [95% interval] n=N ep=E" as a
    string, the interval the tables' episode-level cluster bootstrap (none with one episode), E the
    episodes behind the N items: gpt4score (0-100) and strict correctness from `answer_summary`,
    TeaFarm correctness from `teafarm_summary`, token F1 from `metric_summary` (qa probes when there
    are any), and the method's share of decided head-to-head pairs against the reference pooled over
    criteria (`wins`: tables.pooled_win_shares; without it, from `pairwise_summary` with no interval),
    and with a judge panel (`robust`: tables.robust_pairs) the methods each one beats under every judge,
    and with the judges calibrated (`calibration`: judge_calibration's table) each judge's false
    accepts on one wrong kind (`calibration_column`), the same on every row: it qualifies every
    judged column beside it. A cell whose row has failed items names them (`failed=k`: a failed answer
    is inside n, scored 0, under strict correctness, TeaFarm and token F1, and left out of the gpt4score
    mean, which has no "wrong"; a cell with no value says only `failed=k`). A column no table fills is
    left out; methods in `method_summary` order (each once: that table has a row per dataset and probe
    kind)."""
    names = list(dict.fromkeys(methods["method"].to_list())) if not methods.is_empty() else []
    cols: dict[str, dict[str, str]] = {}
    ds = _overall(answers)
    for judge, label, share in (("gpt4score", "gpt4score (0-100)", False), ("strict", "strict correct", True)):
        rows = answers.filter((pl.col("dataset") == ds) & pl.col("category").is_null() & (pl.col("judge") == judge)) \
            if ds else pl.DataFrame()
        if not rows.is_empty():
            cols[label] = {r["method"]: _with_failed(
                _share(r["score"], r["ci_low"], r["ci_high"], r["judged"], _get(r, "episodes")) if share
                else _mean(r["score"], r["ci_low"], r["ci_high"], r["judged"], ".1f", _get(r, "episodes")), r)
                for r in rows.iter_rows(named=True)}
    ds = _overall(teafarm)
    if ds:
        cols["teafarm correct"] = {r["method"]: _with_failed(_share(r["correctness"], r["ci_low"], r["ci_high"],
                                                                    r["total"], _get(r, "episodes")), r)
                                   for r in teafarm.filter(pl.col("dataset") == ds).iter_rows(named=True)}
    ds = _overall(metrics)
    if ds and "token_f1" in metrics.columns:
        rows = metrics.filter((pl.col("dataset") == ds) & pl.col("category").is_null() & pl.col("session_idx").is_null())
        kind = "qa" if "qa" in rows["kind"].to_list() else (rows["kind"][0] if rows.height else None)
        rows = rows.filter(pl.col("kind") == kind)
        if rows.height:
            cols[f"token_f1 ({kind})"] = {r["method"]: _with_failed(_mean(
                r["token_f1"], r["token_f1_low"], r["token_f1_high"], r["responses"], ".3f", _get(r, "episodes")), r)
                for r in rows.iter_rows(named=True)}
    if wins is not None and not wins.is_empty():
        ds = _overall(wins)
        rows = wins.filter(pl.col("dataset") == ds) if ds else wins.clear()
        if rows.height:
            reference = rows["reference"][0]
            cols[f"win share vs {reference}"] = {reference: "reference", **{
                r["other"]: _share(r["share"], r["share_low"], r["share_high"], r["pairs"], r["episodes"])
                if r["won"] + r["lost"] else f"ties only{_counts(r['pairs'], r['episodes'])}"
                for r in rows.filter(pl.col("reference") == reference).iter_rows(named=True)}}
    elif _overall(pairwise):
        # No pair-level data: the pooled share without an interval (one needs the pairs' episodes).
        rows = pairwise.filter((pl.col("dataset") == _overall(pairwise)) & pl.col("session_idx").is_null())
        reference = rows["reference"][0]
        cell = {reference: "reference"}
        for (other,), part in rows.group_by(["other"], maintain_order=True):
            won, lost = int(part["losses"].sum()), int(part["wins"].sum())  # the other method's view
            n = int(part["pairs"].sum())
            cell[other] = _share(won / (won + lost), None, None, n) if won + lost else f"ties only n={n}"
        cols[f"win share vs {reference}"] = cell
    if robust is not None and not robust.is_empty():
        ds = _overall(robust)
        beats: dict[str, list[str]] = {}
        for r in robust.filter(pl.col("dataset") == ds).iter_rows(named=True):
            winner, loser = {"a_better": (r["method_a"], r["method_b"]),
                             "b_better": (r["method_b"], r["method_a"])}.get(r["verdict"], (None, None))
            if winner:
                beats.setdefault(winner, []).append(loser)
        cols["beats, under every judge"] = {m: ", ".join(beats.get(m, [])) or "-" for m in names}
    column = calibration_column(calibration) if calibration is not None else None
    if column is not None:
        cols[column[0]] = {m: column[1] for m in names}
    for c in cols.values():
        names += [m for m in c if m not in names]
    return pl.DataFrame({"method": names, **{label: [c.get(m, "") for m in names] for label, c in cols.items()}},
                        schema={"method": pl.String, **{label: pl.String for label in cols}})


# ---- judge calibration -------------------------------------------------------------------------

def calibration_column(calibration: pl.DataFrame, prefer: str = "vague") -> tuple[str, str] | None:
    """(label, cell) of the leaderboard's calibration column: each judge's false-accept rate on the
    `prefer` kind (else on the wrong kind most answers were judged on), "lenient 62% (flagged)"."""
    if calibration.is_empty():
        return None
    judged = calibration.filter((pl.col("expected") == "reject") & (pl.col("n") > 0))
    if judged.is_empty():
        return None
    kinds = judged.group_by("kind").agg(pl.col("n").sum()).sort(["n", "kind"], descending=[True, False])
    kind = prefer if prefer in kinds["kind"].to_list() else kinds["kind"][0]
    cells = [f"{r['judge']} {r['false_accept_rate'] * 100:.0f}%" + (" (flagged)" if r["flagged"] else "")
             for r in judged.filter(pl.col("kind") == kind).iter_rows(named=True)]
    return f"judge false accepts ({kind})", ", ".join(cells)


def calibration_view(calibration: pl.DataFrame) -> pl.DataFrame:
    """judge_calibration's table as the report shows it: per judge and kind, the rate that applies as
    "62% [48–74]", n, skipped, failed and the flag."""
    if calibration.is_empty():
        return calibration
    rows = []
    for r in calibration.iter_rows(named=True):
        rows.append({"judge": r["judge"], "kind": r["kind"], "expected": r["expected"],
                     "false accepts": _share(r["false_accept_rate"], r["false_accept_low"], r["false_accept_high"], None),
                     "false rejects": _share(r["false_reject_rate"], r["false_reject_low"], r["false_reject_high"], None),
                     "n": r["n"], "skipped": r["skipped"], "failed": r["failed"],
                     "flagged": "yes" if r["flagged"] else ""})
    return pl.DataFrame(rows)


# ---- win-rate heat map ---------------------------------------------------------------------------

def win_cell(share: float | None, p: float | None, n: int | None, episodes: int | None = None) -> str:
    """A heat-map cell's text: "62% (p=0.03, n=40, ep=10)"."""
    pv = "" if p is None else "p<0.001" if p < 0.001 else f"p={p:.2g}"
    inner = ", ".join(x for x in (pv, f"n={n}" if n is not None else "",
                                  f"ep={episodes}" if episodes is not None else "") if x)
    return (f"{share * 100:.0f}%" if _present(share) else "no decided pair") + (f" ({inner})" if inner else "")


def win_matrices(pairwise: pl.DataFrame) -> list[tuple[str, pl.DataFrame, pl.DataFrame]]:
    """Per dataset, the reference's win share against each other method (rows) per criterion
    (columns), from the whole-dataset rows (`session_idx` null): (caption, cell texts, shares)."""
    if pairwise.is_empty():
        return []
    whole = pairwise.filter(pl.col("session_idx").is_null())
    criteria = sorted(set(whole["criterion"].to_list()))
    out = []
    for (dataset, reference), rows in whole.group_by(["dataset", "reference"], maintain_order=True):
        others = list(dict.fromkeys(rows["other"].to_list()))
        by = {(r["other"], r["criterion"]): r for r in rows.iter_rows(named=True)}
        text = {c: [win_cell(by[(o, c)]["win_share"], by[(o, c)]["p_value"], by[(o, c)]["pairs"],
                             by[(o, c)].get("episodes"))
                    if (o, c) in by else "" for o in others] for c in criteria}
        share = {c: [by[(o, c)]["win_share"] if (o, c) in by else None for o in others] for c in criteria}
        label = f"{reference} vs"
        out.append((f"{dataset}: {reference}'s win share against each method",
                    pl.DataFrame({label: others, **text}, schema={label: pl.String, **{c: pl.String for c in criteria}}),
                    pl.DataFrame({label: others, **share},
                                 schema={label: pl.String, **{c: pl.Float64 for c in criteria}})))
    return out


def _heat(share: float | None) -> str:
    """Green where the reference wins, red where it loses, white at a draw."""
    if not _present(share):
        return "#eee"
    d = max(-1.0, min(1.0, (share - 0.5) * 2))
    return f"hsl({120 if d >= 0 else 0},60%,{100 - abs(d) * 40:.0f}%)"


def heatmap_table(text: pl.DataFrame, share: pl.DataFrame) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in text.columns)
    body = ""
    for t_row, s_row in zip(text.iter_rows(), share.iter_rows()):
        cells = "".join(f"<td style='background:{_heat(s)}'>{html.escape(t)}</td>" for t, s in zip(t_row[1:], s_row[1:]))
        body += f"<tr><th>{html.escape(t_row[0])}</th>{cells}</tr>"
    return f"<div class='scroll'><table class='heatmap'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>"


# ---- page ----------------------------------------------------------------------------------------

def render_markdown(title: str, header: list[str], sections: list[Section], probes: pl.DataFrame) -> str:
    out = [f"# {title}", "", *header, ""]
    for s in sections:
        out += [f"## {s.title}", ""]
        if s.intro:
            out += [s.intro, ""]
        for caption, text, _ in s.matrices:
            out += [f"**{caption}**", "", markdown_table(text)]
        for caption, df in s.tables:
            out += ([f"**{caption}**", ""] if caption else []) + [markdown_table(df)]
        out += [f"![{alt}]({name})\n" for name, alt in s.figures]
    out += ["## Per probe", "", markdown_table(probes)]
    return "\n".join(out)


_STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5em auto;max-width:1240px;color:#222;padding:0 1em}
h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.6em}
.scroll{overflow-x:auto;max-width:100%;margin:.4em 0 1.2em}
table{border-collapse:collapse;font-size:13px}
th,td{border:1px solid #ddd;padding:3px 7px;text-align:left;vertical-align:top}
thead th{background:#f3f3f3}
td{max-width:420px;overflow-wrap:anywhere}
table.leaderboard{font-size:15px}
table.leaderboard td,table.leaderboard th{padding:6px 12px;white-space:nowrap}
table.leaderboard td:first-child{font-weight:600}
table.heatmap td{text-align:center;min-width:9em;white-space:nowrap}
table.heatmap tbody th{background:#fafafa}
.probes td{font-size:12px}
details{margin:.4em 0 1em}
summary{cursor:pointer;color:#236;font-weight:500}
img{max-width:100%;border:1px solid #eee;margin:.5em 0}
.meta{color:#555;font-size:14px;margin:.2em 0}
nav{position:sticky;top:0;background:#fff;padding:.4em 0;border-bottom:1px solid #eee;z-index:2}
nav a{margin-right:1em;font-size:14px}
#pb-filters select{margin-right:1em}
#pb-list details{border:1px solid #e3e3e3;border-radius:4px;padding:.3em .6em;margin:.3em 0}
#pb-list summary{font-weight:normal;color:#222}
.pb-grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(300px,1fr));gap:.6em;margin:.5em 0}
.pb-card{border:1px solid #ddd;border-radius:4px;padding:.4em .6em;font-size:13px;overflow-wrap:anywhere}
.pb-card h4{margin:.1em 0 .3em}
.pb-ctx{font-size:13px;background:#f8f8f8;padding:.4em .6em;border-radius:4px}
.tag{display:inline-block;font-size:11px;padding:0 5px;margin:0 2px;border-radius:3px;background:#eee}
.tag.good{background:#cfe9cf}.tag.bad{background:#f3cccc}.tag.tie{background:#e8e3c8}
.muted{color:#777}
"""

_BROWSER_JS = r"""
(function(){
const data=JSON.parse(document.getElementById('probe-data').textContent);
const $=s=>document.querySelector(s);
const esc=s=>String(s==null?'':s).replace(/[&<>"']/g,c=>({'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;',"'":'&#39;'}[c]));
const uniq=a=>[...new Set(a)].sort((x,y)=>String(x).localeCompare(String(y),undefined,{numeric:true}));
const fill=(id,vals)=>{const s=$(id);for(const v of vals){const o=document.createElement('option');o.value=o.textContent=v;s.appendChild(o);}};
fill('#pb-method',uniq(data.flatMap(p=>p.responses.map(r=>r.method))));
fill('#pb-dataset',uniq(data.map(p=>p.dataset)));
fill('#pb-session',uniq(data.map(p=>String(p.session))));
fill('#pb-verdict',uniq(data.flatMap(p=>p.verdicts)));
const pct=v=>v==null?'n/a':Math.round(v*100)+'%';
const bcls=b=>b==='correct'?'good':b==='correct_without_evidence'?'tie':/^(missed|misread|failed)/.test(b)?'bad':'';
const vcls=v=>/correct$|=other|failed/.test(v)&&!/incorrect/.test(v)?(/failed/.test(v)?'bad':'good'):/incorrect|=reference/.test(v)?'bad':/tie/.test(v)?'tie':'';
const cls=v=>{const b=/ bucket (\S+)$/.exec(v);return b?bcls(b[1]):vcls(v);};
function body(p,method){
  let h='<div class="pb-ctx">';
  if(p.context&&p.context.length)h+=p.context.map(t=>'<div><b>'+esc(t[0])+':</b> '+esc(t[1])+'</div>').join('');
  h+='<div><b>request ('+esc(p.kind)+'):</b> '+esc(p.request)+'</div>';
  if(p.gold!=null)h+='<div><b>gold:</b> '+esc(p.gold)+'</div>';
  h+='</div><div class="pb-grid">';
  for(const r of p.responses){
    if(method&&r.method!==method)continue;
    h+='<div class="pb-card"><h4>'+esc(r.method)+'</h4>';
    h+=r.error?'<div class="tag bad">failed: '+esc(r.error)+'</div>':'<div>'+esc(r.response)+'</div>';
    h+='<div class="muted">memory ('+esc(r.context_tokens)+' tokens): '+esc((r.memory_ids||[]).join(', ')||'none')+'</div>';
    if(r.details)h+='<div class="muted">details: '+esc(r.details)+'</div>';
    if(r.bucket)h+='<div>diagnosis: <span class="tag '+bcls(r.bucket)+'">'+esc(r.bucket)+'</span>'+(r.evidence_written==null?'':' <span class="muted">evidence written '+pct(r.evidence_written)+', retrieved '+pct(r.evidence_retrieved)+'</span>')+'</div>';
    for(const a of p.answers.filter(a=>a.method===r.method))
      h+='<div><span class="tag '+cls(a.verdict)+'">'+esc(a.verdict)+'</span> '+esc(a.reason||'')+'</div>';
    h+='</div>';
  }
  h+='</div>';
  const pw=p.pairwise.filter(x=>!method||x.other===method||x.reference===method);
  if(pw.length){
    const crit=uniq(pw.map(x=>x.criterion)),rows=uniq(pw.map(x=>x.reference+' vs '+x.other));
    h+='<div class="scroll"><table><thead><tr><th>head-to-head</th>'+crit.map(c=>'<th>'+esc(c)+'</th>').join('')+'</tr></thead><tbody>';
    for(const r of rows){
      h+='<tr><th>'+esc(r)+'</th>';
      for(const c of crit){
        const xs=pw.filter(x=>x.reference+' vs '+x.other===r&&x.criterion===c);
        h+='<td>'+xs.map(x=>'<div><span class="muted">'+esc(x.first)+' shown first:</span> <span class="tag '+(x.preferred==='tie'?'tie':'')+'">'+esc(x.preferred==='reference'?x.reference:x.preferred==='other'?x.other:x.preferred)+'</span>'+(x.reason?' '+esc(x.reason):'')+'</div>').join('')+'</td>';
      }
      h+='</tr>';
    }
    h+='</tbody></table></div>';
  }
  return h;
}
function draw(){
  const m=$('#pb-method').value,d=$('#pb-dataset').value,s=$('#pb-session').value,v=$('#pb-verdict').value;
  const shown=data.filter(p=>(!m||p.responses.some(r=>r.method===m))&&(!d||p.dataset===d)&&(!s||String(p.session)===s)&&(!v||p.verdicts.includes(v)));
  $('#pb-count').textContent=shown.length+' of '+data.length+' probes';
  const list=$('#pb-list');list.innerHTML='';
  for(const p of shown){
    const el=document.createElement('details');
    el.innerHTML='<summary><b>'+esc(p.probe_id)+'</b> <span class="muted">'+esc(p.dataset)+' · '+esc(p.episode_id)+' · session '+esc(p.session)+' · '+esc(p.kind)+'</span> '+esc(p.request.slice(0,110))+' '+uniq(p.verdicts.filter(x=>!m||x.startsWith(m+' ')||x.includes(' '+m+' '))).slice(0,6).map(x=>'<span class="tag '+cls(x)+'">'+esc(x)+'</span>').join('')+'</summary>';
    el.addEventListener('toggle',()=>{if(el.open&&!el.dataset.filled){el.insertAdjacentHTML('beforeend',body(p,m));el.dataset.filled=1;}});
    list.appendChild(el);
  }
}
for(const id of ['#pb-method','#pb-dataset','#pb-session','#pb-verdict'])$(id).addEventListener('change',draw);
draw();
})();
"""


def probe_browser(data: list[dict[str, Any]], limit: int) -> str:
    """The per-probe browser: filters, the probe list, the data as an inline JSON blob."""
    blob = json.dumps(data, ensure_ascii=False).replace("</", "<\\/")
    selects = "".join(f"<label>{label} <select id='pb-{key}'><option value=''>all</option></select></label>"
                      for key, label in (("method", "method"), ("dataset", "dataset"), ("session", "session"),
                                         ("verdict", "verdict")))
    capped = f" (the first {limit}: `report.max_probe_rows`)" if len(data) >= limit else ""
    return (f"<p>Each probe: the dialogue context it carries, the request and gold, then per method its response, "
            f"the memory it used, its diagnosis bucket (when the run diagnoses: write, retrieval or read) and the "
            f"answer judges' verdicts, and the head-to-head verdicts with the judge's reason{capped}. Click a probe "
            f"to open it.</p>"
            f"<div id='pb-filters'>{selects}<span id='pb-count' class='muted'></span></div><div id='pb-list'></div>"
            f"<script type='application/json' id='probe-data'>{blob}</script><script>{_BROWSER_JS}</script>")


def render_html(title: str, header: list[str], sections: list[Section], probes: pl.DataFrame,
                browser: str = "") -> str:
    """The page: `sections` in order, then the probe browser (`probe_browser`'s HTML), then the
    per-probe rows folded."""
    anchors = [f"s{i}" for i in range(len(sections))]
    nav = "".join(f"<a href='#{a}'>{html.escape(s.title)}</a>" for a, s in zip(anchors, sections))
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
             f"<style>{_STYLE}</style></head><body><h1>{html.escape(title)}</h1>",
             "".join(f"<p class='meta'>{html.escape(h)}</p>" for h in header),
             (f"<nav>{nav}{'<a href=#browser>Probe browser</a>' if browser else ''}"
              "<a href='#probes'>Per probe</a></nav>")]
    for a, s in zip(anchors, sections):
        parts.append(f"<h2 id='{a}'>{html.escape(s.title)}</h2>")
        if s.intro:
            parts.append(f"<p>{html.escape(s.intro)}</p>")
        for caption, text, share in s.matrices:
            parts += [f"<h3>{html.escape(caption)}</h3>", heatmap_table(text, share)]
        for caption, df in s.tables:
            parts.append(html_table(df, s.table_class, caption))
        parts += [f"<img src='{html.escape(name)}' alt='{html.escape(alt)}'>" for name, alt in s.figures]
    if browser:
        parts += ["<h2 id='browser'>Probe browser</h2>", browser]
    parts += ["<h2 id='probes'>Per probe</h2>",
              (f"<details><summary>Every (probe, method) row ({probes.height})</summary>"
               f"{html_table(probes, 'probes', fold=False)}</details>"),
              "</body></html>"]
    return "\n".join(parts)


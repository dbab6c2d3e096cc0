"""Calibrating the answer judges on answers whose verdict is known by construction (issue 63).

From a corpus's question / gold pairs (the ingest `qa` rows) this module builds labelled answers:
- ACCEPT kinds (a judge that rejects one makes a false reject):
  - `gold`: the gold answer itself;
  - `gold_in_longer`: the gold inside a longer answer that adds nothing false (a seeded frame);
  - `paraphrase`: the gold reworded by the LLM role `paraphraser`, kept only when a second call of
    the same role says both mean the same AND the rule `keeps_content` holds (every number, month
    and capitalised name of the gold is still in the paraphrase);
- REJECT kinds (a judge that accepts one makes a false accept):
  - `shifted_date`: the first date of the gold moved by a day (by a month when it has no day, by a
    year when it is a bare year), written in the gold's own format;
  - `swapped_entity`: a capitalised name of the gold replaced by another name of the same
    conversation (its speakers and the names its turns use), else by one of a fixed list;
  - `changed_number`: every number of the gold outside its dates moved by the same seeded amount of
    2 or 3 (never by one, which LongMemEval's temporal prompt forgives in a count by design);
  - `vague`: a non-committal answer that names nothing (one of a fixed set, seeded);
  - `not_mentioned`: says the conversation does not tell, for a question it answers;
  - `negation`: a yes / no flipped, or "not" put in after (or taken out from) the gold's first
    auxiliary verb.
A kind that does not apply to a question is skipped with the reason (no date, no number, no name, a
bare answer with nothing to negate); every kind skips unanswerable and abstention questions (their
"gold" explains why there is no answer) and LongMemEval's preference rubrics (a rubric is not an
answer). Everything is seeded per (seed, question, kind), so the same corpus gives the same answers.

Pure functions over plain records; the paraphraser's calls are built here as messages and parsed
into typed models, and run by the stage (stages/judging/judge_calibration.py). All wording is ours.
"""

from __future__ import annotations

import calendar
import random
import re
from dataclasses import dataclass
from datetime import date, timedelta
from typing import Any, Iterable, Literal, Sequence

from pydantic import BaseModel, Field

from pipeline.llm.types import Messages
from stages.metrics.significance import wilson_interval

Kind = Literal["gold", "gold_in_longer", "paraphrase", "shifted_date", "swapped_entity", "changed_number",
               "vague", "not_mentioned", "negation"]
ACCEPT_KINDS: tuple[Kind, ...] = ("gold", "gold_in_longer", "paraphrase")
REJECT_KINDS: tuple[Kind, ...] = ("shifted_date", "swapped_entity", "changed_number", "vague", "not_mentioned", "negation")
KINDS = (*ACCEPT_KINDS, *REJECT_KINDS)
RULE = "keeps_content"  # the rule a paraphrase must pass besides the paraphraser's own check

SKIP_UNANSWERABLE = "unanswerable or abstention question (no gold answer to build from)"
SKIP_RUBRIC = "preference rubric (not an answer)"
SKIP_NO_DATE = "no date in the gold"
SKIP_NO_NAME = "no capitalised name in the gold"
SKIP_NO_NUMBER = "no number in the gold outside its dates"
SKIP_NO_NEGATION = "nothing to negate (no yes / no and no auxiliary verb: a bare answer)"
SKIP_PARAPHRASE = "paraphrase not kept"  # followed by why: the check, the rule, or both
RUBRIC_CATEGORIES = frozenset({"single-session-preference"})
UNANSWERABLE_CATEGORIES = frozenset({"adversarial", "5"})

# Frames of a longer correct answer around the gold, and answers that commit to nothing (ours).
LONGER = ("From what came up in the conversation, the answer is {gold}.",
          "{gold} - that is what was said when this came up.",
          "As far as the earlier conversations go: {gold}. Nothing said there points elsewhere.")
VAGUE = ("It's hard to say exactly; it could have been one of several things.",
         "Something along the lines of what they talked about before, I believe.",
         "It was mentioned at some point, but the details are not clear.",
         "Probably one of the usual things; it depends on how you look at it.")
NOT_MENTIONED = ("The conversation does not say.",
                 "That is not mentioned anywhere in the conversation.",
                 "There is no information about this in the conversations.")
# Names to swap in when the conversation offers none (ours).
FIXED_NAMES = ("Morgan", "Tallinn", "Rosalind", "Okafor", "Valparaiso", "Henrik", "Marisol", "Quentin")

MONTHS = [calendar.month_name[i] for i in range(1, 13)]
MONTH_INDEX = {**{m.lower(): i for i, m in enumerate(MONTHS, 1)},
               **{m[:3].lower(): i for i, m in enumerate(MONTHS, 1)}, "sept": 9}
DAYS = {d.lower() for d in calendar.day_name} | {d[:3].lower() for d in calendar.day_name}
_MONTH = r"(?P<month>" + "|".join(sorted({*MONTHS, *(m[:3] for m in MONTHS), "Sept"}, key=len, reverse=True)) + r")\.?"
_DAY = r"(?P<day>[0-3]?\d)(?P<suffix>st|nd|rd|th)?"
_YEAR = r"(?P<year>(?:19|20)\d\d)"
# Most specific first; the first that matches anywhere in the gold is the date that moves.
DATE_PATTERNS = (
    ("iso", re.compile(r"\b(?P<year>\d{4})-(?P<month>\d{2})-(?P<day>\d{2})\b")),
    ("day_month_year", re.compile(rf"\b{_DAY}\s+(?:of\s+)?{_MONTH},?\s+{_YEAR}\b", re.I)),
    ("month_day_year", re.compile(rf"\b{_MONTH}\s+{_DAY},?\s+{_YEAR}\b", re.I)),
    ("month_year", re.compile(rf"\b{_MONTH},?\s+{_YEAR}\b", re.I)),
    ("day_month", re.compile(rf"\b{_DAY}\s+(?:of\s+)?{_MONTH}(?!\w)", re.I)),
    ("month_day", re.compile(rf"\b{_MONTH}\s+{_DAY}\b", re.I)),
    ("year", re.compile(rf"\b{_YEAR}\b")),
)
NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
                "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen", "twenty")
_NUMBER = re.compile(r"\b(?P<num>\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)?)(?P<suffix>st|nd|rd|th)?\b|\b(?P<word>"
                     + "|".join(NUMBER_WORDS) + r")\b", re.I)
_WORD = re.compile(r"[^\W\d_][^\W\d_'’-]*(?:['’-][^\W\d_]+)*")  # letters of any script, "O'Neil", "Jean-Luc"
_POSSESSIVE = re.compile(r"['’]s$", re.I)
# Capitalised words that are not names: function words, answers and hedges that open a sentence.
STOP = frozenset("""a an the i i'm i've it it's he she they we you my your his her their our its me us them
this that these those there here some any all both each every no yes not likely probably maybe perhaps possibly
in on at by for with after before about around during since from to of and or but so if when while as because
what which who whom where why how one two three few several many most more less also only just once then
mr mrs ms dr st""".split())
# ("may" is left out: it is a month as often as a verb in a gold answer)
AUXILIARIES = ("is", "are", "was", "were", "has", "have", "had", "does", "do", "did", "could", "will", "would",
               "should", "might", "must")
_AUX = re.compile(r"\b(?P<aux>" + "|".join(AUXILIARIES) + r")(?:(?P<neg>n['’]t)\b|\b(?P<not>\s+not\b)?"
                  r"(?P<never>\s+never\b)?)", re.I)
_YES_NO = re.compile(r"\b(?P<w>yes|no)\b", re.I)


@dataclass(frozen=True)
class Construction:
    """One labelled answer, or why its kind does not apply (`skipped`)."""

    kind: str
    expected: Literal["accept", "reject"]
    answer: str | None
    change: str | None = None  # what was changed ("8 May 2023 -> 9 May 2023"), for the reader
    skipped: str | None = None


def expected_of(kind: str) -> Literal["accept", "reject"]:
    return "accept" if kind in ACCEPT_KINDS else "reject"


def item_rng(seed: int, qa_id: str, kind: str) -> random.Random:
    """The seeded generator of one (question, kind): a str seed hashes the same in every process."""
    return random.Random(f"{seed}:{qa_id}:{kind}")


def draw(qa: list[dict[str, Any]], max_items: int | None, seed: int) -> list[dict[str, Any]]:
    """The questions calibrated: all (by episode and id), or `max_items` of them drawn with `seed`."""
    rows = sorted(qa, key=lambda r: (r["episode_id"], r["qa_id"]))
    if max_items is None or len(rows) <= max_items:
        return rows
    return [rows[i] for i in sorted(random.Random(f"{seed}:draw").sample(range(len(rows)), max_items))]


def skip_reason(qa: dict[str, Any]) -> str | None:
    """Why no kind applies to a question: unanswerable / abstention, or a preference rubric."""
    if qa.get("answer") in (None, "") or qa.get("abstention") or str(qa.get("category")) in UNANSWERABLE_CATEGORIES:
        return SKIP_UNANSWERABLE
    if str(qa.get("category")) in RUBRIC_CATEGORIES:
        return SKIP_RUBRIC
    return None


# ---- dates ----------------------------------------------------------------------------------------

def find_date(text: str) -> tuple[str, re.Match[str]] | None:
    """(format, match) of the first date in `text`, trying the most specific format first."""
    for name, pattern in DATE_PATTERNS:
        for m in pattern.finditer(text):
            if name in ("iso",) and not _valid_iso(m):
                continue
            if "day" in m.groupdict() and m.group("day") and not 1 <= int(m.group("day")) <= 31:
                continue
            return name, m
    return None


def _valid_iso(m: re.Match[str]) -> bool:
    return 1 <= int(m.group("month")) <= 12 and 1 <= int(m.group("day")) <= 31


def _month_word(original: str, month: int) -> str:
    """Month `month` written as `original` is: in full or short ("Sept" stays four letters), its case kept."""
    full = original.lower() in {m.lower() for m in MONTHS}
    word = MONTHS[month - 1] if full else MONTHS[month - 1][:3]
    if original.isupper():
        return word.upper()
    return word.lower() if original.islower() else word


def ordinal_suffix(n: int) -> str:
    return "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")


def shift_date(text: str, rng: random.Random) -> tuple[str, str] | None:
    """(the text with its first date moved, "old -> new"), or None when it holds no date. A date with
    a day moves by one day, a month and year by one month, a bare year by one year, up or down
    (seeded); the new date is written in the old one's format."""
    found = find_date(text)
    if found is None:
        return None
    fmt, m = found
    step = rng.choice((-1, 1))
    groups = m.groupdict()
    year = int(groups["year"]) if groups.get("year") else 2000  # a leap year: 29 February stays valid
    month = (int(groups["month"]) if fmt == "iso" else MONTH_INDEX[groups["month"].lower().rstrip(".")]) \
        if groups.get("month") else 1
    values: dict[str, str] = {}
    if groups.get("day"):
        try:
            moved = date(year, month, int(groups["day"])) + timedelta(days=step)
        except ValueError:
            return None
        values["day"] = f"{moved.day:02d}" if fmt == "iso" else str(moved.day)
        if groups.get("suffix"):
            values["suffix"] = ordinal_suffix(moved.day)
        y, mo = moved.year, moved.month
    elif groups.get("month"):
        mo, y = month + step, year
        y, mo = (y - 1, 12) if mo == 0 else (y + 1, 1) if mo == 13 else (y, mo)
    else:
        y, mo = year + step, month
    if groups.get("month"):
        values["month"] = f"{mo:02d}" if fmt == "iso" else _month_word(groups["month"].rstrip("."), mo)
    if groups.get("year"):
        values["year"] = str(y)
    new = _replace_groups(m, values)
    return text[:m.start()] + new + text[m.end():], f"{m.group(0)} -> {new}"


def _replace_groups(m: re.Match[str], values: dict[str, str]) -> str:
    """The matched text with each named group in `values` rewritten (right to left, spans intact)."""
    out, base = m.group(0), m.start()
    for name in sorted(values, key=lambda g: m.start(g), reverse=True):
        s, e = m.span(name)
        out = out[:s - base] + values[name] + out[e - base:]
    return out


def date_spans(text: str) -> list[tuple[int, int]]:
    """Spans of every date `find_date`'s formats find in `text` (numbers inside them are not numbers)."""
    return [m.span() for _, p in DATE_PATTERNS for m in p.finditer(text)]


# ---- numbers --------------------------------------------------------------------------------------

def numbers(text: str) -> list[re.Match[str]]:
    """Numbers of `text` outside its dates: digits (with thousands commas, decimals, ordinals) and the
    number words zero to twenty."""
    dates = date_spans(text)
    return [m for m in _NUMBER.finditer(text) if not any(s <= m.start() < e for s, e in dates)]


def change_numbers(text: str, rng: random.Random) -> tuple[str, str] | None:
    """(the text with every number outside its dates moved by the same seeded 2 or 3, up or down
    where it stays above zero, "old -> new" per number), or None when it holds none."""
    found = numbers(text)
    if not found:
        return None
    delta = rng.choice((2, 3)) * rng.choice((-1, 1))
    if any(_value(m) + delta <= 0 for m in found):  # keep counts and amounts above zero
        delta = abs(delta)
    out, changes = text, []
    for m in reversed(found):
        new = _written(m, _value(m) + delta)
        out = out[:m.start()] + new + out[m.end():]
        changes.append(f"{m.group(0)} -> {new}")
    return out, "; ".join(reversed(changes))


def _value(m: re.Match[str]) -> float:
    if m.group("word"):
        return float(NUMBER_WORDS.index(m.group("word").lower()))
    return float(m.group("num").replace(",", ""))


def _written(m: re.Match[str], value: float) -> str:
    """`value` written as the number `m` was: a word, digits with its commas, decimals or ordinal."""
    if m.group("word"):
        word = NUMBER_WORDS[int(value)] if 0 <= value <= 20 else str(int(value))
        return word.capitalize() if m.group("word")[0].isupper() else word
    num = m.group("num")
    if "." in num:
        return f"{value:.{len(num.split('.')[1])}f}"
    text = f"{int(value):,}" if "," in num else str(int(value))
    return text + (ordinal_suffix(int(value)) if m.group("suffix") else "")


# ---- names ----------------------------------------------------------------------------------------

def _sentence_initial(text: str, start: int) -> bool:
    before = text[:start].rstrip(" \t\"'(“‘")
    return not before or before[-1] in ".!?:;\n"


def _is_name_word(word: str) -> bool:
    low = re.split(r"['’]", word.lower())[0]  # "I'll" is "i"
    return word[0].isupper() and low not in STOP and low not in MONTH_INDEX and low not in DAYS and len(low) > 1


@dataclass(frozen=True)
class _Word:
    """A word of a name, its possessive "'s" cut off."""

    start: int
    end: int
    text: str


def names(text: str, known: Iterable[str] | None = None) -> list[tuple[int, int, str]]:
    """Capitalised names of `text` as (start, end, name), runs of capitalised words taken as one name
    ("Shiba Inu"). A word opening a sentence is capitalised anyway: it counts as a name only when
    `known` (the conversation's names) holds it, or, without `known`, when it is not a common word."""
    known_low = {k.lower() for k in known} if known is not None else None
    out: list[tuple[int, int, str]] = []
    run: list[_Word] = []

    def close() -> None:
        if run:
            out.append((run[0].start, run[-1].end, " ".join(w.text for w in run)))
            run.clear()

    possessive = False
    for w in _WORD.finditer(text):
        word = _POSSESSIVE.sub("", w.group(0))
        name_like = _is_name_word(word)
        if name_like and not run and _sentence_initial(text, w.start()) and known_low is not None:
            name_like = word.lower() in known_low
        adjacent = run and not possessive and text[run[-1].end:w.start()] == " "
        if not (name_like and (not run or adjacent)):
            close()
        if name_like:
            run.append(_Word(w.start(), w.start() + len(word), word))
        possessive = word != w.group(0)  # "Rosa's Diner": the name ends at the possessive
    close()
    return out


def conversation_names(turns: Iterable[dict[str, Any]], speakers: Iterable[str] = ()) -> list[str]:
    """The names a conversation uses, sorted: its speakers, and every capitalised word its turns use
    inside a sentence (a word that opens one is capitalised anyway)."""
    found = {s for s in speakers if s and _is_name_word(s)}
    for t in turns:
        text = t.get("text") or ""
        for w in _WORD.finditer(text):
            word = _POSSESSIVE.sub("", w.group(0))
            if _is_name_word(word) and not _sentence_initial(text, w.start()):
                found.add(word)
    return sorted(found)


def swap_name(text: str, pool: list[str], rng: random.Random) -> tuple[str, str] | None:
    """(the text with one of its names, seeded, replaced by another name of `pool` (else of
    FIXED_NAMES) that the text does not hold, "old -> new"), or None when the text names nobody."""
    found = names(text, pool or None)
    if not found:
        return None
    start, end, old = rng.choice(found)
    taken = {w.lower() for _, _, n in found for w in n.split()}
    others = [p for p in pool if p.lower() not in taken and p.lower() not in text.lower()]
    new = rng.choice(others or [n for n in FIXED_NAMES if n.lower() not in text.lower()])
    return text[:start] + new + text[end:], f"{old} -> {new}"


# ---- negation -------------------------------------------------------------------------------------

def negate(text: str) -> tuple[str, str] | None:
    """(the text negated, what changed), or None for a bare answer: a yes / no flipped (the first one),
    else the first auxiliary verb negated ("was" -> "was not"; "did not" / "didn't" -> "did")."""
    yn = _YES_NO.search(text)
    if yn:
        word = yn.group("w")
        flipped = {"yes": "no", "no": "yes"}[word.lower()]
        flipped = flipped.capitalize() if word[0].isupper() else flipped
        return text[:yn.start()] + flipped + text[yn.end():], f"{word} -> {flipped}"
    aux = _AUX.search(text)
    if aux is None:
        return None
    verb = aux.group("aux")
    new = verb if aux.group("neg") or aux.group("not") else f"{verb} at times" if aux.group("never") else f"{verb} not"
    return text[:aux.start()] + new + text[aux.end():], f"{aux.group(0)} -> {new}"


# ---- the constructions ----------------------------------------------------------------------------

def construct(qa: dict[str, Any], kind: str, seed: int, pool: Sequence[str] = ()) -> Construction:
    """The labelled answer of `kind` built from a question's gold (`qa`: an ingest qa row), or the
    construction with `skipped` saying why the kind does not apply. `pool`: the conversation's names
    (`conversation_names`). `paraphrase` is built by the LLM (`paraphrase_messages`): here it is
    only checked for applying."""
    expected = expected_of(kind)
    why = skip_reason(qa)
    if why is not None:
        return Construction(kind, expected, None, skipped=why)
    gold = str(qa["answer"]).strip()
    rng = item_rng(seed, qa["qa_id"], kind)
    if kind == "gold":
        return Construction(kind, expected, gold, "the gold answer")
    if kind == "gold_in_longer":
        frame = rng.choice(LONGER)
        return Construction(kind, expected, frame.format(gold=gold.rstrip(".")), f"framed: {frame}")
    if kind == "paraphrase":
        return Construction(kind, expected, None, "written by the paraphraser")
    if kind == "vague":
        return Construction(kind, expected, rng.choice(VAGUE), "non-committal")
    if kind == "not_mentioned":
        return Construction(kind, expected, rng.choice(NOT_MENTIONED), "says the conversation does not tell")
    made, skip = {"shifted_date": (lambda: shift_date(gold, rng), SKIP_NO_DATE),
                  "swapped_entity": (lambda: swap_name(gold, list(pool), rng), SKIP_NO_NAME),
                  "changed_number": (lambda: change_numbers(gold, rng), SKIP_NO_NUMBER),
                  "negation": (lambda: negate(gold), SKIP_NO_NEGATION)}[kind]
    result = made()
    if result is None:
        return Construction(kind, expected, None, skipped=skip)
    answer, change = result
    return Construction(kind, expected, answer, change)


# ---- the paraphrase and its rule ------------------------------------------------------------------

PARAPHRASE_SYSTEM = ("You reword a short answer to a question. Say the same thing in other words: keep every "
                     "fact it gives, every name, number, date and place, and add nothing, drop nothing. Change "
                     "the wording and the order of the words where you can.")
SAME_SYSTEM = ("You compare two answers to the same question. Decide whether they state the same facts: "
               "nothing added, nothing left out, nothing changed. Wording and word order do not matter.")
PROMPTS = {"calibration.paraphrase": PARAPHRASE_SYSTEM, "calibration.same": SAME_SYSTEM,
           **{f"calibration.longer.{i}": t for i, t in enumerate(LONGER)},
           **{f"calibration.vague.{i}": t for i, t in enumerate(VAGUE)},
           **{f"calibration.not_mentioned.{i}": t for i, t in enumerate(NOT_MENTIONED)}}


class Paraphrase(BaseModel):
    paraphrase: str = Field(min_length=1, max_length=800)


class SameMeaning(BaseModel):
    same: bool


def paraphrase_messages(question: str, gold: str) -> Messages:
    """The paraphraser's request: the question and the gold to reword."""
    return [{"role": "system", "content": PARAPHRASE_SYSTEM},
            {"role": "user", "content": f"Question: {question}\nAnswer: {gold}\n\n"
                                        'Reply in JSON: {"paraphrase": the answer in other words}.'}]


def same_meaning_messages(question: str, gold: str, paraphrase: str) -> Messages:
    """The paraphraser's second pass: do the gold and the paraphrase mean the same?"""
    return [{"role": "system", "content": SAME_SYSTEM},
            {"role": "user", "content": f"Question: {question}\nAnswer A: {gold}\nAnswer B: {paraphrase}\n\n"
                                        'Reply in JSON: {"same": true | false}.'}]


def content_of(text: str) -> list[str]:
    """What `keeps_content` requires to survive: the gold's numbers (digits or words), the months of
    its dates and its capitalised names, lower-cased."""
    items = [str(int(_value(m))) if m.group("word") else m.group("num").replace(",", "") for m in _NUMBER.finditer(text)]
    items += [w.group(0).lower() for w in _WORD.finditer(text) if w.group(0).lower() in MONTH_INDEX]
    items += [w.lower() for _, _, n in names(text) for w in n.split()]
    return list(dict.fromkeys(items))


def keeps_content(gold: str, paraphrase: str) -> tuple[bool, list[str]]:
    """The rule `keeps_content`: every number (as digits or as its word), month (full or short) and
    capitalised name of the gold is in the paraphrase; (holds, what is missing)."""
    words = {_POSSESSIVE.sub("", w.group(0).lower()) for w in _WORD.finditer(paraphrase)}
    digits = {m.group("num").replace(",", "") for m in _NUMBER.finditer(paraphrase) if m.group("num")} | {
        str(NUMBER_WORDS.index(m.group("word").lower())) for m in _NUMBER.finditer(paraphrase) if m.group("word")}
    missing = []
    for item in content_of(gold):
        if item[0].isdigit():
            ok = item in digits or item.split(".")[0] in digits
        elif item in MONTH_INDEX:
            ok = any(MONTH_INDEX.get(w) == MONTH_INDEX[item] for w in words)
        else:
            ok = item in words
        if not ok:
            missing.append(item)
    return not missing, missing


def paraphrase_verdict(gold: str, paraphrase: str | None, same: bool | None) -> tuple[bool, bool, str | None]:
    """(rule holds, kept, why not kept): a paraphrase is kept only when the paraphraser's check says
    it means the same AND `keeps_content` holds."""
    if paraphrase is None:
        return False, False, f"{SKIP_PARAPHRASE}: none written"
    rule_ok, missing = keeps_content(gold, paraphrase)
    why = [*(["the check says it differs"] if not same else []),
           *([f"{RULE} misses {', '.join(missing)}"] if not rule_ok else [])]
    return rule_ok, not why, f"{SKIP_PARAPHRASE}: {'; '.join(why)}" if why else None


# ---- rates ----------------------------------------------------------------------------------------

def wilson(count: int, n: int) -> tuple[float | None, float | None, float | None]:
    """(share, low, high): the share with its 95% Wilson interval (statsmodels, through
    stages/metrics/significance.py as every other share); Nones for n = 0."""
    low, high = wilson_interval(count, n)
    return (count / n if n else None), low, high


def summarize(items: list[dict[str, Any]], max_false_accept: float) -> list[dict[str, Any]]:
    """One row per (judge, kind) from the per-item rows (`judge`, `judge_kind`, `judge_model`, `kind`,
    `expected`, `skipped`, `error`, `accepted`): `n` answers with a verdict, `skipped` constructions
    that did not apply (or paraphrases not kept), `failed` judgments; the false-accept rate of a
    reject kind or the false-reject rate of an accept kind with its Wilson interval (the other rate
    null); `flagged` when false accepts exceed `max_false_accept`."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in items:
        groups.setdefault((r["judge"], r["kind"]), []).append(r)
    order: dict[str, int] = {k: i for i, k in enumerate(KINDS)}
    out = []
    for (judge, kind), rows in sorted(groups.items(), key=lambda kv: (kv[0][0], order.get(kv[0][1], 99))):
        judged = [r for r in rows if r["skipped"] is None and r["error"] is None and r["accepted"] is not None]
        expected = expected_of(kind)
        wrong = sum(r["accepted"] != (expected == "accept") for r in judged)
        rate, low, high = wilson(wrong, len(judged))
        fa = (rate, low, high) if expected == "reject" else (None, None, None)
        fr = (rate, low, high) if expected == "accept" else (None, None, None)
        out.append({"judge": judge, "judge_kind": rows[0]["judge_kind"],
                    "judge_model": next((r["judge_model"] for r in rows if r["judge_model"]), None),
                    "kind": kind, "expected": expected, "n": len(judged),
                    "skipped": sum(r["skipped"] is not None for r in rows),
                    "failed": sum(r["skipped"] is None and (r["error"] is not None or r["accepted"] is None)
                                  for r in rows),
                    "false_accept_rate": fa[0], "false_accept_low": fa[1], "false_accept_high": fa[2],
                    "false_reject_rate": fr[0], "false_reject_low": fr[1], "false_reject_high": fr[2],
                    "flagged": fa[0] is not None and fa[0] > max_false_accept})
    return out

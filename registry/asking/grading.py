"""Reading the final answer out of a model's reply, and grading it against the gold answer by the question's answer
kind. A reply no answer can be read from is graded wrong (and counted as unparseable by the run).

The kinds (data/formats/answer_kinds.py, stored with each gold answer): `letter`, `letters` (a set), `number` (within
a relative tolerance), `expression` (equal as mathematics, through Hugging Face's math-verify), `text` (equal once
case, spacing and a final full stop are set aside).

The final answer of a free-form reply is, most explicit first: the last `\\boxed{...}`, the last "the answer is ..." or
"Answer: ...", else the reply's last line. Letters count only up to the number of options the question has.
"""
from __future__ import annotations

import math
import re

from registry.data.formats.answer_kinds import LETTERS, kind_of, letter_set, number

NUMBER_REL_TOL = 1e-4       # a number within this relative distance of the gold is right (rounded replies)
MATH_MAX_CHARS = 300        # longer final answers are not handed to sympy (a hostile reply must not stall a grade)
_OPTION_LINE = re.compile(r"^\(([A-Z])\) ", re.MULTILINE)
_ANSWER_IS = re.compile(r"(?:final\s+answer|answer)\s*(?:is|:|=)\s*:?\s*(.+)", re.IGNORECASE)


def options_in(text: str) -> int:
    """How many lettered options a stored query text has ("(A) ..." lines, as text_encoder.query_text writes)."""
    return len(_OPTION_LINE.findall(text or ""))


def _boxed(text: str) -> str | None:
    """The content of the last \\boxed{...} (or \\fbox{...}), braces balanced."""
    at = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if at < 0:
        return None
    start = text.find("{", at)
    if start < 0:
        return None
    depth = 0
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start + 1:i].strip()
    return None


def final_answer(reply: str | None) -> str | None:
    """The part of a reply that states its final answer (see the module's doc), trimmed; None for an empty one."""
    if not reply or not reply.strip():
        return None
    boxed = _boxed(reply)
    if boxed:
        return boxed
    stated = _ANSWER_IS.findall(reply)
    if stated:
        return _trim(stated[-1])
    lines = [ln for ln in reply.strip().splitlines() if ln.strip()]
    return _trim(lines[-1]) if lines else None


def _trim(text: str) -> str:
    text = text.strip().strip("*").strip()
    text = re.sub(r"^\$+|\$+$", "", text).strip()
    text = re.sub(r"^\\\(|\\\)$", "", text).strip()
    return text[:-1].strip() if text.endswith(".") and not text.endswith("..") else text


_EXPLICIT = [re.compile(p, re.IGNORECASE) for p in (
    r"answer\s+is[\s:]*\(?\**\s*([A-Z])\b",
    r"answer\s*[:=]\s*\(?\**\s*([A-Z])\b",
)] + [re.compile(p) for p in (r"\*\*\(?([A-Z])\)?\*\*", r"^\s*\(([A-Z])\)")]


def extract_letter(text: str | None, options: int | None = None) -> str | None:
    """The one option letter a reply gives, or None (none, several, or one past the question's options)."""
    if not text:
        return None
    allowed = LETTERS[:options or 10]
    final = final_answer(text)
    letters = letter_set(final, len(allowed)) if final else None
    if letters is not None:
        return next(iter(letters)) if len(letters) == 1 else None
    for form in _EXPLICIT:
        found = [f.upper() for f in form.findall(text)]
        if found:
            return found[-1] if found[-1] in allowed else None     # a reply that reasons first answers last
    return None


def extract(text: str | None, grading: str, *, options: int | None = None, gold: str = "") -> str | None:
    """The answer a reply gives, as the kind is graded: a letter, sorted letters joined by commas, or the final
    answer's text; None when none can be read."""
    kind = kind_of(grading, gold)
    if kind == "letter":
        return extract_letter(text, options)
    final = final_answer(text)
    if final is None:
        return None
    if kind == "letters":
        letters = letter_set(final, options or 10)
        return ",".join(sorted(letters)) if letters else None
    return final


def _same_math(answer: str, gold: str) -> bool:
    """Equal as mathematics, by math-verify (sympy underneath), for answers short enough to parse safely."""
    if len(answer) > MATH_MAX_CHARS or len(gold) > MATH_MAX_CHARS or answer.count("^") + answer.count("**") > 2:
        return False
    try:
        from math_verify import parse, verify

        wanted = parse(f"${gold}$", parsing_timeout=None)     # (the timeouts use signals: main thread only)
        got = parse(f"${answer}$", parsing_timeout=None)
        return bool(wanted and got and verify(wanted, got, timeout_seconds=None))
    except Exception:       # (math-verify says no by returning False; anything it raises is a no as well)
        return False


def _plain(text: str) -> str:
    return " ".join(text.casefold().split()).strip("\"'`").removesuffix(".").strip()


def grade(extracted: str | None, gold: str, grading: str) -> bool:
    """Whether the extracted answer is the gold answer, by the kind."""
    if extracted is None:
        return False
    kind = kind_of(grading, gold)
    if kind == "letter":
        return extracted.upper() == gold.strip().strip("()").upper()
    if kind == "letters":
        wanted = letter_set(gold, len(LETTERS))
        return wanted is not None and set(extracted.split(",")) == wanted
    if _plain(extracted) == _plain(gold):
        return True
    if kind == "text":
        return False
    a, g = number(extracted), number(gold)
    if a is not None and g is not None:
        return math.isclose(a, g, rel_tol=NUMBER_REL_TOL, abs_tol=1e-12)
    return _same_math(extracted, gold)

"""The kinds of gold answers, as `query_answers.grading` stores them, and how a new answer's kind is told from the
answer and its question's options: `letter` one option of a multiple-choice question, `letters` a set of options
("A, C"), `number`, `expression` (mathematics that is not a plain number), `text`. Rows written before the kinds were
told apart say `exact`: their kind is read from the answer (`kind_of`). Grading by kind is asking/grading.py's."""
from __future__ import annotations

import re

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
KINDS = ("letter", "letters", "number", "expression", "text")
_NUMBER = re.compile(r"[-+]?(\d{1,3}(,\d{3})+|\d+)?(\.\d+)?([eE][-+]?\d+)?%?")


def kind_of(grading: str, gold: str) -> str:
    """The answer kind to grade by: as stored, or for a row written before kinds (`exact`), read from the gold."""
    if grading in KINDS:
        return grading
    if grading != "exact":
        return "text"
    if number(gold) is not None:
        return "number"
    if re.search(r"\\[a-zA-Z]+|\^|[{}]|\d\s*[-+*/]\s*\d", gold):
        return "expression"
    return "text"


def answer_kind(answer: str, options: int) -> str:
    """The kind of a new gold answer: its question's option count decides between a letter, a set of letters and
    the rest (kind_of)."""
    if options:
        bare = answer.strip().strip("()")
        if len(bare) == 1 and bare.upper() in LETTERS[:options]:
            return "letter"
        letters = letter_set(answer, options)
        if letters and len(letters) > 1:
            return "letters"
    return kind_of("exact", answer)


def letter_set(text: str, options: int) -> set[str] | None:
    """The option letters a final answer names ("C", "(C)", "A, C", "A and C", "AC", "\\text{C}"); None when it
    holds anything else (a word, a letter past the question's options)."""
    text = re.sub(r"\\text(bf)?\{([^}]*)\}", r"\2", text).strip().rstrip(".")
    text = re.sub(r"^(option|options|choice|choices)\s+", "", text, flags=re.IGNORECASE)
    allowed = LETTERS[:options or len(LETTERS)]
    parts = [p for p in re.split(r"\s*(?:,|;|&|\band\b|\s)\s*", text) if p]
    found: set[str] = set()
    for p in parts:
        p = p.strip("()[]*.:")
        if len(p) >= 1 and p.isupper() and all(c in allowed for c in p) and len(set(p)) == len(p):
            found |= set(p)
        else:
            return None
    return found or None


def number(text: str) -> float | None:
    """A plain number, with thousands commas, a percent sign, a leading ".", or a fraction a/b or \\frac{a}{b}."""
    t = re.sub(r"^\\?\$|\\?\$$", "", text.strip()).replace("\\!", "").replace("{,}", ",").strip()
    frac = (re.fullmatch(r"(-?)\\d?frac\{(-?[\d.]+)\}\{(-?[\d.]+)\}", t)
            or re.fullmatch(r"(-?)([\d.]+)\s*/\s*([\d.]+)", t))
    try:
        if frac:
            value = float(frac.group(2)) / float(frac.group(3))
            return -value if frac.group(1) else value
        if not t or not _NUMBER.fullmatch(t) or not re.search(r"\d", t):
            return None
        return float(t.rstrip("%").replace(",", "")) / (100 if t.endswith("%") else 1)
    except (ValueError, ZeroDivisionError):
        return None

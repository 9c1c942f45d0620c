"""Reading the answer out of a model's reply, and grading it against the gold answer. A reply no answer can be read
from is graded wrong (and counted as unparseable by the run)."""
from __future__ import annotations

import re

LETTERS = "ABCDEFGHIJ"
# the usual forms, most explicit first: "The answer is (C)", "Answer: C", "**C**", "(C)", a bare "C"
_FORMS = [re.compile(p, re.IGNORECASE) for p in (
    r"answer\s+is[\s:]*\(?\**\s*([A-J])\b",
    r"answer\s*[:=]\s*\(?\**\s*([A-J])\b",
)] + [re.compile(p) for p in (
    r"\*\*\(?([A-J])\)?\*\*",
    r"^\s*\(([A-J])\)",
    r"^\s*([A-J])\s*[.)]?\s*$",
)]


def extract_letter(text: str | None) -> str | None:
    """The answer letter a reply gives, or None when none can be read."""
    if not text:
        return None
    for form in _FORMS:
        found = form.findall(text)
        if found:
            return found[-1].upper()     # a reply that reasons first gives its answer last
    return None


def extract(text: str | None, grading: str) -> str | None:
    if grading == "letter":
        return extract_letter(text)
    cleaned = (text or "").strip().strip(".").strip()
    return cleaned or None


def grade(extracted: str | None, gold: str, grading: str) -> bool:
    if extracted is None:
        return False
    if grading == "letter":
        return extracted.upper() == gold.upper()
    return extracted.casefold() == gold.strip().casefold()

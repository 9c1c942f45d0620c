"""Grading real replies: each reply form graded right against its gold, and no wrong reply graded right (the table
holds, for every right form, wrong ones of the same form)."""
from __future__ import annotations

import pytest

from registry.asking import grading
from registry.data.formats import answer_kinds

TEN = 10        # options of an MMLU-Pro question

# (gold, kind, options, reply, right?)
TABLE = [
    # one letter, in the usual forms and in free-form reasoning
    ("C", "letter", TEN, "The answer is (C)", True),
    ("C", "letter", TEN, "Answer: C", True),
    ("C", "letter", TEN, "**C**", True),
    ("C", "letter", TEN, "C", True),
    ("C", "letter", TEN, "Let me think. (A) is wrong, (B) too.\nSo the answer is (C).", True),
    ("C", "letter", TEN, "Reasoning...\n\\boxed{C}", True),
    ("C", "letter", TEN, "Therefore \\boxed{\\text{C}}", True),
    ("C", "letter", TEN, "The answer is (B)", False),
    ("C", "letter", TEN, "\\boxed{D}", False),
    ("C", "letter", TEN, "A, C", False),                       # two letters for one
    ("C", "letter", TEN, "I cannot tell.", False),
    ("C", "letter", 3, "The answer is (K)", False),
    # letters past J, up to the number of options
    ("L", "letter", 14, "The answer is (L)", True),
    ("L", "letter", 14, "\\boxed{L}", True),
    ("L", "letter", 14, "The answer is (M)", False),
    ("L", "letter", 10, "The answer is (L)", False),           # (no option L on a ten-option question)
    # sets of letters
    ("A, C", "letters", 5, "A, C", True),
    ("A, C", "letters", 5, "The answer is A and C", True),
    ("A, C", "letters", 5, "\\boxed{AC}", True),
    ("A, C", "letters", 5, "(C), (A)", True),
    ("A, C", "letters", 5, "A, B, C", False),
    ("A, C", "letters", 5, "A", False),
    ("A, C", "letters", 5, "A, F", False),                     # (no option F)
    # numbers: fractions, decimals, thousands, percent, a gold starting with "."
    ("1/2", "number", 0, "0.5", True),
    ("1/2", "number", 0, "\\frac{1}{2}", True),
    ("1/2", "number", 0, "So x = 1/2.\n\\boxed{\\dfrac{1}{2}}", True),
    ("1/2", "number", 0, "0.6", False),
    ("0.5", "number", 0, "The answer is 1/2", True),
    (".5", "number", 0, "0.5", True),
    (".5", "number", 0, "5", False),
    ("1000", "number", 0, "The final answer is 1,000.", True),
    ("1000", "number", 0, "100", False),
    ("25%", "number", 0, "0.25", True),
    ("3.14159", "number", 0, "3.1416", True),                  # rounded within the tolerance
    ("3.14159", "number", 0, "3.15", False),
    ("-2", "number", 0, "$-2$", True),
    ("-2", "number", 0, "2", False),
    # expressions: equal as mathematics
    ("\\frac{\\sqrt{3}}{2}", "expression", 0, "\\boxed{\\frac{\\sqrt3}{2}}", True),
    ("\\frac{\\sqrt{3}}{2}", "expression", 0, "\\boxed{\\frac{\\sqrt{2}}{2}}", False),
    ("2x+2", "expression", 0, "The answer is 2(x+1)", True),
    ("2x+2", "expression", 0, "The answer is 2(x+2)", False),
    ("\\pi/2", "expression", 0, "\\boxed{\\frac{\\pi}{2}}", True),
    ("\\pi/2", "expression", 0, "\\boxed{\\pi}", False),
    # text: an answer inside a sentence, the last line, a gold starting with "."
    ("Paris", "text", 0, "The answer is Paris.", True),
    ("Paris", "text", 0, "Let me recall.\nParis", True),
    ("Paris", "text", 0, "The answer is Lyon.", False),
    (".NET", "text", 0, "The answer is .NET", True),
    (".NET", "text", 0, "NET", False),
]


@pytest.mark.parametrize("gold, kind, options, reply, right", TABLE)
def test_each_reply_form_is_graded_by_its_kind(gold, kind, options, reply, right):
    extracted = grading.extract(reply, kind, options=options, gold=gold)
    assert grading.grade(extracted, gold, kind) is right, (reply, extracted)


def test_the_table_holds_a_wrong_reply_for_every_kind():
    for kind in answer_kinds.KINDS:
        rows = [r for r in TABLE if r[1] == kind]
        assert any(r[4] for r in rows) and any(not r[4] for r in rows), kind


@pytest.mark.parametrize("stored, gold, kind", [("exact", "1/2", "number"), ("exact", ".5", "number"),
                                                 ("exact", "\\sqrt{2}", "expression"), ("exact", "Paris", "text"),
                                                 ("letter", "C", "letter")])
def test_rows_stored_before_the_kinds_are_read_by_their_gold(stored, gold, kind):
    assert answer_kinds.kind_of(stored, gold) == kind


@pytest.mark.parametrize("answer, options, kind", [("C", 10, "letter"), ("A, C", 5, "letters"), ("42", 0, "number"),
                                                   ("x^2", 0, "expression"), ("Paris", 0, "text"),
                                                   ("Paris", 4, "text")])
def test_a_new_gold_answer_gets_its_kind(answer, options, kind):
    assert answer_kinds.answer_kind(answer, options) == kind


def test_a_hostile_reply_is_no_stall_and_no_right_answer():
    assert not grading.grade(grading.extract("\\boxed{9^9^9^9^9}", "expression", gold="x"), "x", "expression")
    assert not grading.grade(grading.extract("1" * 100_000, "number", gold="1"), "1", "number")


def test_options_are_counted_from_the_stored_text():
    assert grading.options_in("Which?\n(A) one\n(B) two\n(C) three") == 3
    assert grading.options_in("What is 2+2?") == 0

"""The one prompt template `registry ask` renders questions with. Its version is stored with every answer: an
endpoint is asked a question again only under a new template version."""
from __future__ import annotations

TEMPLATE_VERSION = "mc-letter-v1"
INSTRUCTION = ("Answer the following multiple choice question. Reply with the letter of the right option, "
               "in the form \"The answer is (X)\".")
SET_INSTRUCTION = ("Answer the following multiple choice question, which may have several right options. Reply "
                   "with the letters of every right option, in the form \"The answer is A, C\".")
EXACT_INSTRUCTION = "Answer the following question with the answer alone, nothing else."


def render(text: str, grading: str) -> list[dict]:
    """The chat messages for one query: `text` is the query as stored (the question, then its lettered options)."""
    instruction = {"letter": INSTRUCTION, "letters": SET_INSTRUCTION}.get(grading, EXACT_INSTRUCTION)
    return [{"role": "user", "content": f"{instruction}\n\n{text.strip()}"}]

"""Cheap checks beside the statistics, as providers' own verifiers make them, on each answer as it comes: does the
answer name the model that was asked for (a slug silently redirected to another model shows there), and are the
prompt tokens it bills in proportion to the prompt sent (a proxy that pads or double-counts shows there)?

The model check allows what providers do honestly: the name asked for, or that name with a dated or versioned
snapshot after it (`gpt-4o` answered as `gpt-4o-2024-08-06` passes, as `gpt-4o-mini` does not), compared without
case or a provider prefix (`openai/gpt-4o`). The billing check compares billed prompt tokens with the prompt's UTF-8
bytes / 4 (about 4 bytes a token for English under the usual BPE tokenisers, 3 for mathematics and code, more
tokens per byte in scripts outside Latin): more than BILLED_RATIO times that is flagged. A faithful endpoint's ratio
on MMLU-Pro prompts is about 1; billing twice the tokens gives 2."""
from __future__ import annotations

import re

BILLED_RATIO = 1.6          # billed / (prompt bytes / 4) above which the bill is flagged
TEMPLATE_TOKENS = 12        # the chat template's own tokens, billed on top of the prompt (role markers)
_SNAPSHOT = re.compile(r"^[-_@:.]?(\d{4}-?\d{2}-?\d{2}|\d{4}|v?\d+(\.\d+)*|latest|preview|\d{4}-preview)$")


def _bare(name: str) -> str:
    return name.strip().casefold().rsplit("/", 1)[-1]


def model_problem(asked: str, served: str | None) -> str | None:
    """One line when the answer names another model than the one asked for; None when it is that model (or says
    no name: many servers do not)."""
    if not served:
        return None
    a, s = _bare(asked), _bare(served)
    if s == a or (s.startswith(a) and _SNAPSHOT.match(s[len(a):])):
        return None
    return f"answered as {served[:120]!r}, not the {asked!r} asked for"


def billing_problem(prompt_tokens: int, prompt_bytes: int) -> str | None:
    """One line when the prompt tokens billed are out of proportion to the prompt sent; None otherwise (or when the
    answer bills nothing)."""
    if prompt_tokens <= 0 or prompt_bytes <= 0:
        return None
    expected = prompt_bytes / 4 + TEMPLATE_TOKENS
    if prompt_tokens <= BILLED_RATIO * expected:
        return None
    return (f"billed {prompt_tokens} prompt tokens for a prompt of about {expected:.0f} ({prompt_bytes} bytes): "
            f"{prompt_tokens / expected:.1f} times")


def flags(asked: str, replies) -> list[str]:
    """The checks' lines over replies in the order they came, each kind said once (from the first answer that
    shows it)."""
    out: dict[str, str] = {}
    for r in replies:
        if r.text is None:
            continue
        for kind, problem in (("model", model_problem(asked, r.served_model)),
                              ("billing", billing_problem(r.prompt_tokens, r.prompt_bytes))):
            if problem and kind not in out:
                out[kind] = problem
    return list(out.values())

"""How every generator spells numbers and operands: float literals, parentheses, arithmetic precedence."""

from __future__ import annotations


def float_text(value: float) -> str:
    text = repr(float(value))
    return text if "e" in text or "." in text else text + ".0"


def bare(text: str) -> str:
    """``text`` without one pair of parentheses around all of it (where it has them)."""
    if not (text.startswith("(") and text.endswith(")")):
        return text
    depth = 0
    for k, ch in enumerate(text):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0 and k < len(text) - 1:
            return text
    return text[1:-1]


ARITH = {"*": 2, "/": 2, "//": 2, "%": 2, "+": 1, "-": 1}  # precedence: * / // % bind tighter than + -

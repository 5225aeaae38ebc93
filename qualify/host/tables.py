"""Plain-text tables for people: the one renderer of `show`, `inspect`, the benchmarks and pins."""

from __future__ import annotations

from typing import List, Optional, Sequence

ELLIPSIS = "…"


def clip(text: str, width: int) -> str:
    """`text` cut to `width` characters, the cut marked with an ellipsis."""
    text = str(text)
    if width <= 0:
        return ""
    return text if len(text) <= width else text[: max(width - 1, 0)] + ELLIPSIS


def _fit_widths(widths: List[int], total: int, sep: int = 2) -> List[int]:
    """Shrink the widest columns until the row fits `total` characters (each keeps at least 4)."""
    widths = list(widths)
    while sum(widths) + sep * (len(widths) - 1) > total:
        i = max(range(len(widths)), key=lambda k: widths[k])
        if widths[i] <= 4:
            break
        widths[i] -= 1
    return widths


def table(rows: Sequence[Sequence[str]], headers: Sequence[str], width: Optional[int] = None,
          rule: bool = True) -> str:
    """Left-aligned columns; with `width`, the widest columns shrink to fit and cut text ends in an
    ellipsis; `rule` puts a line of dashes under the headers."""
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows)] if rows else [len(h) for h in headers]
    if width is not None:
        widths = _fit_widths(widths, width)
    line = lambda r: "  ".join(clip(str(v), w).ljust(w) for v, w in zip(r, widths)).rstrip()  # noqa: E731
    head = [line(headers)] + ([line(["-" * w for w in widths])] if rule else [])
    return "\n".join(head + [line(r) for r in rows])

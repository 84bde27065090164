"""Stop-string matching on incrementally produced text (torch-free)."""

from __future__ import annotations


def find_stop_string(
    text: str, num_new_chars: int, stop: list[str], include_stop_str_in_output: bool
) -> tuple[str, int] | None:
    """Find the earliest stop string that the newest text completes.

    Only matches that end inside the new characters are considered: older text was
    checked when it arrived.

    Args:
        text: All output text so far.
        num_new_chars: How many trailing characters of ``text`` are new.
        stop: The stop strings.
        include_stop_str_in_output: Keep the stop string in the text.

    Returns:
        ``(stop_string, length to truncate the text to)``, or ``None`` when none matched.
    """
    best: tuple[str, int] | None = None
    best_start = len(text) + 1
    for s in stop:
        start = text.find(s, max(0, len(text) - num_new_chars - len(s) + 1))
        if start != -1 and start < best_start:
            best_start = start
            best = (s, start + len(s) if include_stop_str_in_output else start)
    return best

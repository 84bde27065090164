"""Stop-string matching on incrementally produced text (torch-free).

Invariants:
    * A request's stop strings are indexed once, when the request arrives
      (:class:`StopStringMatcher`); checking new text never walks the whole list. It costs,
      per new character, one hash-set lookup per *distinct length* among the stop
      strings, so 100,000 stop strings of a dozen lengths cost a dozen lookups, and a
      request with many stop strings does not slow the output path of the others.
    * The number of distinct lengths is bounded by the longest stop string allowed,
      :data:`MAX_STOP_STRING_CHARS`; a longer one is refused when the request is
      validated (:func:`check_stop_strings`), so no request can make the per-token check
      expensive.
    * Matches are vLLM's (``check_stop_strings``): only matches that end inside the new
      characters count (older text was checked when it arrived); the match that *ends*
      first wins, and between matches ending at the same place the stop string listed
      first wins. So text arriving several tokens at once stops where it would have
      stopped arriving one token at a time.
"""

from __future__ import annotations

from typing import Sequence

# Longer stop strings are refused. Stop strings are markers ("\n\n", "</answer>",
# "Observation:"); this leaves room for whole sentences while bounding the per-character
# cost of matching (one lookup per distinct length, each slicing at most this much).
MAX_STOP_STRING_CHARS = 1024


def check_stop_strings(stop: Sequence[str] | None) -> None:
    """Refuse stop strings that would make matching expensive.

    Args:
        stop: The request's stop strings.

    Raises:
        ValueError: A stop string is longer than :data:`MAX_STOP_STRING_CHARS`.
    """
    for index, s in enumerate(stop or ()):
        if len(s) > MAX_STOP_STRING_CHARS:
            raise ValueError(f"stop[{index}] has {len(s)} characters; a stop string may have at most "
                             f"{MAX_STOP_STRING_CHARS}")


class StopStringMatcher:
    """One request's stop strings, indexed by length.

    Args:
        stop: The stop strings, in the request's order (duplicates are allowed).

    Raises:
        ValueError: A stop string is too long (see :func:`check_stop_strings`).
    """

    def __init__(self, stop: Sequence[str]) -> None:
        check_stop_strings(stop)
        # Where each string first appears in the request: breaks ties between matches
        # that end at the same place, as a scan in list order would.
        self._order: dict[str, int] = {}
        for index, s in enumerate(stop):
            self._order.setdefault(s, index)
        by_length: dict[int, set[str]] = {}
        for s in self._order:
            by_length.setdefault(len(s), set()).add(s)
        self._buckets = sorted(by_length.items(), reverse=True)
        self.max_length = self._buckets[0][0] if self._buckets else 0

    @property
    def lengths(self) -> tuple[int, ...]:
        """The distinct lengths of the stop strings, longest first: the lookups made per
        new character."""
        return tuple(length for length, _ in self._buckets)

    def __bool__(self) -> bool:
        return self.max_length > 0

    def find(self, text: str, num_new_chars: int, include_stop_str_in_output: bool) -> tuple[str, int] | None:
        """Find the stop string that the newest text completes first (see the module).

        Args:
            text: All output text so far.
            num_new_chars: How many trailing characters of ``text`` are new.
            include_stop_str_in_output: Keep the stop string in the text.

        Returns:
            ``(stop_string, length to truncate the text to)``, or ``None`` when none matched.
        """
        for end in range(max(len(text) - num_new_chars, 0) + 1, len(text) + 1):
            found = self._first_listed_ending_at(text, end)
            if found is not None:  # the earliest end: later ones cannot win
                return found, end if include_stop_str_in_output else end - len(found)
        return None

    def _first_listed_ending_at(self, text: str, end: int) -> str | None:
        """Of the stop strings ending at ``end``, the one listed first (``None``: none)."""
        best: str | None = None
        for length, bucket in self._buckets:
            start = end - length
            if start < 0:
                continue
            piece = text[start:end]
            if piece in bucket and (best is None or self._order[piece] < self._order[best]):
                best = piece
        return best


def find_stop_string(
    text: str, num_new_chars: int, stop: Sequence[str], include_stop_str_in_output: bool
) -> tuple[str, int] | None:
    """Find the stop string that the newest text completes first (one-off; see the module).

    Builds a :class:`StopStringMatcher` for this call; code that checks the same request
    repeatedly should keep one matcher instead.

    Args:
        text: All output text so far.
        num_new_chars: How many trailing characters of ``text`` are new.
        stop: The stop strings.
        include_stop_str_in_output: Keep the stop string in the text.

    Returns:
        ``(stop_string, length to truncate the text to)``, or ``None`` when none matched.
    """
    return StopStringMatcher(stop).find(text, num_new_chars, include_stop_str_in_output)

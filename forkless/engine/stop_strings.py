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
    * Matches are the same as a scan of every stop string would find: only matches that
      end inside the new characters count (older text was checked when it arrived); the
      earliest start wins, and between matches starting at the same place the stop
      string listed first wins.
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
        # that start at the same place, as a scan in list order would.
        self._order: dict[str, int] = {}
        for index, s in enumerate(stop):
            self._order.setdefault(s, index)
        by_length: dict[int, set[str]] = {}
        for s in self._order:
            by_length.setdefault(len(s), set()).add(s)
        # Longest first: at a given end position the longest match starts earliest.
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
        """Find the earliest stop string that the newest text completes.

        Args:
            text: All output text so far.
            num_new_chars: How many trailing characters of ``text`` are new.
            include_stop_str_in_output: Keep the stop string in the text.

        Returns:
            ``(stop_string, length to truncate the text to)``, or ``None`` when none matched.
        """
        best: tuple[int, int] | None = None  # (start, order) of the best match so far
        best_string = ""
        for end in range(max(len(text) - num_new_chars, 0) + 1, len(text) + 1):
            if best is not None and end - self.max_length > best[0]:
                break  # every match ending here or later starts after the best one
            found = self._longest_ending_at(text, end, best)
            if found is not None:
                candidate = (end - len(found), self._order[found])
                if best is None or candidate < best:
                    best, best_string = candidate, found
        if best is None:
            return None
        start = best[0]
        return best_string, start + len(best_string) if include_stop_str_in_output else start

    def _longest_ending_at(self, text: str, end: int, best: tuple[int, int] | None) -> str | None:
        """The longest stop string ending at ``end`` that could still beat ``best``."""
        for length, bucket in self._buckets:
            start = end - length
            if start < 0:
                continue
            if best is not None and start > best[0]:
                return None  # shorter strings start later still
            piece = text[start:end]
            if piece in bucket:
                return piece
        return None


def find_stop_string(
    text: str, num_new_chars: int, stop: Sequence[str], include_stop_str_in_output: bool
) -> tuple[str, int] | None:
    """Find the earliest stop string that the newest text completes (one-off).

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

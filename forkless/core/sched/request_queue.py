"""Waiting queues, one per scheduling policy."""

from __future__ import annotations

import heapq
import itertools
from abc import ABC, abstractmethod
from collections import deque
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    from forkless.core.request import Request


class RequestQueue(ABC):
    """The requests waiting for admission, in the order the policy admits them."""

    @abstractmethod
    def add(self, request: Request) -> None:
        """Queue a newly arrived request."""

    @abstractmethod
    def add_preempted(self, request: Request) -> None:
        """Queue a request that was just preempted (it should come back soon)."""

    @abstractmethod
    def peek(self) -> Request:
        """The next request to admit. Raises IndexError when empty."""

    @abstractmethod
    def pop(self) -> Request:
        """Remove and return the next request to admit. Raises IndexError when empty."""

    @abstractmethod
    def remove(self, request: Request) -> None:
        """Remove a queued request (abort). Raises ValueError when absent."""

    @abstractmethod
    def prepend(self, requests: list[Request]) -> None:
        """Put back requests just popped and passed over, in the order they were popped,
        ahead of everything still queued (where they were)."""

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def __iter__(self) -> Iterator[Request]:
        """The queued requests, in no guaranteed order."""


class FCFSRequestQueue(RequestQueue):
    """First come, first served; preempted requests go back to the front."""

    def __init__(self) -> None:
        self._queue: deque[Request] = deque()

    def add(self, request: Request) -> None:
        self._queue.append(request)

    def add_preempted(self, request: Request) -> None:
        self._queue.appendleft(request)

    def peek(self) -> Request:
        return self._queue[0]

    def pop(self) -> Request:
        return self._queue.popleft()

    def remove(self, request: Request) -> None:
        self._queue.remove(request)

    def prepend(self, requests: list[Request]) -> None:
        self._queue.extendleft(reversed(requests))

    def __len__(self) -> int:
        return len(self._queue)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._queue)


class PriorityRequestQueue(RequestQueue):
    """Lowest ``priority`` first, then earliest ``arrival_time``, then insertion order.

    A preempted request keeps its key, so it resumes ahead of everything it outranks.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[int, float, int, Request]] = []
        self._seq = itertools.count()
        # Sequence numbers for requests put back by prepend(): below every number handed
        # out so far, so a put-back request still wins ties against what was behind it.
        self._front_seq = -1

    def add(self, request: Request) -> None:
        heapq.heappush(self._heap, (request.priority, request.arrival_time, next(self._seq), request))

    add_preempted = add

    def peek(self) -> Request:
        return self._heap[0][3]

    def pop(self) -> Request:
        return heapq.heappop(self._heap)[3]

    def prepend(self, requests: list[Request]) -> None:
        # Popped requests were at the top: each outranked (or tied and preceded) all that
        # is still queued. Fresh numbers below every other keep that, and keep their order.
        first = self._front_seq - len(requests) + 1
        for i, request in enumerate(requests):
            heapq.heappush(self._heap, (request.priority, request.arrival_time, first + i, request))
        self._front_seq = first - 1

    def remove(self, request: Request) -> None:
        for i, entry in enumerate(self._heap):
            if entry[3] is request:
                self._heap[i] = self._heap[-1]
                self._heap.pop()
                heapq.heapify(self._heap)
                return
        raise ValueError(f"request {request.request_id!r} is not queued")

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[Request]:
        return (entry[3] for entry in self._heap)


def create_request_queue(policy: str) -> RequestQueue:
    """The waiting queue of a scheduling policy.

    Args:
        policy: ``"fcfs"`` or ``"priority"``.

    Returns:
        An empty queue.
    """
    if policy == "fcfs":
        return FCFSRequestQueue()
    if policy == "priority":
        return PriorityRequestQueue()
    raise ValueError(f"unknown scheduling policy {policy!r}; choose one of fcfs, priority")

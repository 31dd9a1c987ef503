"""Whose turn it is on the model thread: control jobs first, then every viewer in turn.

The model thread serves participants round-robin: each stream's own jobs (its chunks: one chunk
per turn) and each answer batch (the questions of every stream, decoded together: a few tokens for
all of them per turn). So a viewer who floods the thread with questions gets one turn in each
round like everyone else, and a stream's chunks are not starved by other viewers' answers: with n
participants waiting, each waits for at most n - 1 turns. A participant that had nothing to do
joins at the back of the round, except an answer batch, which goes first: a question asked of a
quiet server waits only for the job in flight. Within a stream, a question goes ahead of its
queued chunks. Control jobs (building or dropping a stream's memories) are quick and come first,
but never while a batch holds answers: it finishes them first (`next`).

Not locked: the `ModelWorker` holds its own lock around every call.
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator

from hermes.serving.jobs import Batch, Job


class Turns:
    """The queued jobs of the model thread, and the round of participants waiting for a turn."""

    def __init__(self, control: int = 0) -> None:
        self._control_priority = control
        self._control: deque[Job] = deque()
        self._queues: dict[object, list[tuple[int, int, Job]]] = {}
        self._ring: OrderedDict[object, None] = OrderedDict()  # participants waiting, in turn order
        self._held: set[object] = set()  # batches taking their turn now
        self._answering: set[object] = set()  # batches that hold answers between their turns
        self._seq = itertools.count()

    def __bool__(self) -> bool:
        """Whether any job is queued, or a batch holds answers between its turns."""
        return bool(self._control or self._ring or any(self._queues.values()))

    def push(self, job: Job) -> None:
        """Queue `job`: a control job for the front, else in its participant's queue."""
        if job.priority == self._control_priority:
            self._control.append(job)
            return
        key = job.batch if job.batch is not None else job.owner
        heapq.heappush(self._queues.setdefault(key, []), (job.priority, next(self._seq), job))
        if key not in self._ring and key not in self._held:
            self._ring[key] = None
            if job.batch is not None:  # answers wait for the job in flight only, when they can
                self._ring.move_to_end(key, last=False)

    def jobs(self) -> Iterator[Job]:
        """Every queued job."""
        yield from self._control
        for queue in self._queues.values():
            yield from (job for _, _, job in queue)

    def control_waiting(self) -> bool:
        return bool(self._control)

    def others_waiting(self) -> bool:
        """Whether a participant other than the batch taking its turn is waiting."""
        return bool(self._control or self._ring)

    def next(self) -> Job | Batch | None:
        """The next job to run, or the batch whose turn it is (held until `release`); None if idle.
        A waiting control job runs first, unless a batch holds answers: that batch's turn comes
        first, and it finishes them (taking no more in) before the control job runs."""
        if self._control:
            if not self._answering:
                return self._control.popleft()
            key = next(iter(self._answering))
            self._ring.pop(key, None)
            self._held.add(key)
            return key
        if not self._ring:
            return None
        key = next(iter(self._ring))
        queue = self._queues.get(key)
        if queue is None or not queue or not _is_owner(queue[0][2], key):
            self._ring.pop(key)
            self._held.add(key)
            return key
        job = heapq.heappop(queue)[2]
        if queue:
            self._ring.move_to_end(key)
        else:
            self._ring.pop(key)
            del self._queues[key]
        return job

    def take(self, batch: Batch) -> list[Job]:
        """The queued jobs of `batch`, in queue order, out of the queue."""
        return [job for _, _, job in sorted(self._queues.pop(batch, []))]

    def release(self, batch: Batch, answering: bool) -> None:
        """`batch`'s turn is over; while it still holds answers (`answering`) or has questions queued,
        it waits for its next turn at the back of the round."""
        self._held.discard(batch)
        if answering:
            self._answering.add(batch)
        else:
            self._answering.discard(batch)
        if answering or self._queues.get(batch):
            self._ring[batch] = None
            self._ring.move_to_end(batch)

    def remove(self, drop: Callable[[Job], bool]) -> list[Job]:
        """Take the queued jobs for which `drop` is true out of the queue; them."""
        dropped = [job for job in self._control if drop(job)]
        self._control = deque(job for job in self._control if not drop(job))
        for key in list(self._queues):
            queue = self._queues[key]
            dropped += [job for _, _, job in queue if drop(job)]
            kept = [entry for entry in queue if not drop(entry[2])]
            heapq.heapify(kept)
            self._queues[key] = kept
            if not kept:
                del self._queues[key]
                if key not in self._answering:
                    self._ring.pop(key, None)
        return dropped


def _is_owner(job: Job, key: object) -> bool:
    """Whether `key` is a stream (its queue holds its own jobs), not a batch."""
    return job.batch is None and job.owner == key

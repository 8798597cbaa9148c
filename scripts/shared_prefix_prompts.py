"""Writes configs/prompts/shared_prefix.jsonl: eight prompts sharing one long text (a Python
module's docstring, imports and helpers, ~1,230 tokens with the shipped tokenizer) followed by
a short, different question. Used by configs/shared-prefix.toml.

    python3 scripts/shared_prefix_prompts.py
"""
import json
import pathlib
system = '''"""Task scheduling helpers shared by the worker processes.

A job is a callable with its arguments, a priority and a deadline.  Jobs wait in a
priority queue ordered by (priority, deadline, sequence number); the sequence number
keeps the order of jobs that tie, so the queue is stable.  Workers take the first job
whose dependencies are done, run it, and record the result or the exception in the
job table.  A job that fails is retried with an exponential backoff until it runs out
of attempts; then every job that depends on it is cancelled.

The helpers below are small on purpose: each does one thing and can be tested alone.
"""

import heapq
import itertools
import logging
import threading
import time
from collections import defaultdict, deque

log = logging.getLogger(__name__)

DEFAULT_PRIORITY = 10
DEFAULT_ATTEMPTS = 3
BACKOFF_BASE = 0.5
BACKOFF_LIMIT = 30.0


class JobError(Exception):
    """Raised when a job cannot be scheduled or has failed for good."""


class Job:
    """One unit of work and its bookkeeping."""

    _counter = itertools.count()

    def __init__(self, func, args=(), kwargs=None, priority=DEFAULT_PRIORITY,
                 deadline=None, attempts=DEFAULT_ATTEMPTS, depends_on=()):
        self.func = func
        self.args = tuple(args)
        self.kwargs = dict(kwargs or {})
        self.priority = priority
        self.deadline = deadline
        self.attempts = attempts
        self.depends_on = tuple(depends_on)
        self.sequence = next(self._counter)
        self.result = None
        self.error = None
        self.done = False
        self.cancelled = False

    def sort_key(self):
        deadline = self.deadline if self.deadline is not None else float("inf")
        return (self.priority, deadline, self.sequence)

    def __lt__(self, other):
        return self.sort_key() < other.sort_key()


def backoff_delay(attempt, base=BACKOFF_BASE, limit=BACKOFF_LIMIT):
    """Return the delay before retry number `attempt` (0-based)."""
    if attempt < 0:
        raise ValueError("attempt must be non-negative")
    return min(limit, base * (2 ** attempt))


def ready(job, table):
    """Return True when every job that `job` depends on has finished."""
    for dep in job.depends_on:
        other = table.get(dep)
        if other is None or not other.done:
            return False
    return True


class JobQueue:
    """A thread-safe priority queue of jobs."""

    def __init__(self):
        self._heap = []
        self._lock = threading.Lock()
        self._table = {}

    def __len__(self):
        with self._lock:
            return len(self._heap)

    def push(self, job_id, job):
        with self._lock:
            if job_id in self._table:
                raise JobError(f"duplicate job id {job_id!r}")
            self._table[job_id] = job
            heapq.heappush(self._heap, (job.sort_key(), job_id))

'''
questions = [
    ("pop_ready", "    def pop_ready(self):"),
    ("run_job", "def run_job(job, now=time.monotonic):"),
    ("retry", "def schedule_retry(queue, job_id, job):"),
    ("overdue", "def overdue_jobs(table, now):"),
    ("stats", "class QueueStats:\n\n    def __init__(self, queue):"),
    ("drain", "    def drain(self, timeout=None):"),
    ("topo", "def topological_order(table):"),
    ("worker", "class Worker(threading.Thread):\n\n    def run(self):"),
]
out = pathlib.Path(__file__).resolve().parent.parent / "configs/prompts/shared_prefix.jsonl"
with open(out, "w") as f:
    for qid, q in questions:
        f.write(json.dumps({"id": qid, "prompt": system + q}) + "\n")
print(f"{out}: {len(questions)} prompts, shared text of {len(system)} characters")

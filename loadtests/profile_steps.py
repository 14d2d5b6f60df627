"""Sampled stacks → the request path's steps: py-spy's raw output read, classified, summed.

``py-spy record --format raw`` writes one line per distinct stack: frames from the root to the
leaf, joined by ``;``, each ``function (file:line)`` with ``file`` relative to ``sys.path``
(``gateway/admit/gate.py``, ``aiohttp/client.py``), then a space and the number of samples
that stack got. Only samples of threads on a CPU are recorded (py-spy's default, no
``--idle``), so a step's share of the samples is its share of the process's CPU time.

A sample belongs to the step of its innermost frame that has one (:func:`step_of`): a
gateway module's step, or ``http stack`` for uvicorn, aiohttp, asyncio and the libraries
under them; frames of no step (the standard library's ``json``, ``re``, ``typing``...) go to
their caller's. A gateway module outside the steps (``gateway/handler.py``, ``gateway/app.py``,
the protocols' parsers...) and a sample with no such frame at all are ``other``.
"""

from __future__ import annotations

import subprocess
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

# (prefix of the frame's file, step); the first prefix that matches wins, so the more
# specific ones come first. The steps are the step budget's: admit, plan, route, attempt, relay
# (the relay and the protocols' splice and assembly), account, telemetry, the HTTP stack.
STEP_PREFIXES: tuple[tuple[str, str], ...] = (
    ("gateway/admit/", "admit"),
    ("gateway/plan/", "plan"),
    ("gateway/routing/", "route"),
    ("gateway/upstream/", "attempt"),
    ("gateway/relay/", "relay"),
    ("gateway/protocols/openai/splice", "relay"),
    ("gateway/protocols/openai/assemble", "relay"),
    ("gateway/account", "account"),
    ("gateway/telemetry/", "telemetry"),
    ("uvicorn/", "http stack"),
    ("aiohttp/", "http stack"),
    ("asyncio/", "http stack"),
    ("uvloop/", "http stack"),
    ("httptools/", "http stack"),
    ("multidict/", "http stack"),
    ("yarl/", "http stack"),
    ("aiohappyeyeballs/", "http stack"),
    ("starlette/", "http stack"),
)
# the process's main stack under every callback the loop runs (runpy, the CLI, uvicorn's
# server, asyncio's runner): in every sample's stack, they would head the cumulative ranking
# without telling anything; their self time (the loop's C code) stays in ``top_self``
MAIN_STACK_FILES = frozenset({"<frozen runpy>", "gateway/__main__.py", "gateway/cli.py",
                              "gateway/server.py", "uvicorn/server.py", "uvicorn/_compat.py",
                              "asyncio/runners.py", "loadtests/floor_proxy.py"})
STEPS: tuple[str, ...] = ("admit", "plan", "route", "attempt", "relay", "account", "telemetry",
                          "http stack", "other")  # fmt: skip


def frame_file(frame: str) -> str:
    """The file of one raw frame: ``'f (gateway/x.py:12)'`` → ``'gateway/x.py'`` (``''``
    for a frame without one, e.g. py-spy's ``process 123:"..."`` roots)."""
    if not frame.endswith(")") or " (" not in frame:
        return ""
    inner = frame[frame.rindex(" (") + 2 : -1]
    return inner.rsplit(":", 1)[0]


def frame_function(frame: str) -> str:
    """One raw frame without its line: ``'f (gateway/x.py:12)'`` → ``'f (gateway/x.py)'``."""
    file = frame_file(frame)
    if not file:
        return frame
    return f"{frame[: frame.rindex(' (')]} ({file})"


def step_of_file(file: str) -> str | None:
    """The step a frame of ``file`` belongs to, or None when it has none of its own."""
    if "site-packages/" in file:  # full paths (py-spy --full-filenames) → the package's
        file = file.rsplit("site-packages/", 1)[1]
    for prefix, step in STEP_PREFIXES:
        if file.startswith(prefix):
            return step
    return None


def step_of(frames: list[str]) -> str:
    """The step of one sample (frames root → leaf): its innermost frame's with a step;
    ``'other'`` when none has one (another gateway module, glue, a C call at the root)."""
    for frame in reversed(frames):
        file = frame_file(frame)
        step = step_of_file(file)
        if step is not None:
            return step
        if file.startswith("gateway/"):  # the gateway's own code outside the steps
            return "other"
    return "other"


@dataclass
class Profile:
    """Samples summed: per step, per function (self: the leaf; cumulative: anywhere on the
    stack, once per sample), and in total."""

    total: int = 0
    steps: Counter = field(default_factory=Counter)
    self_: Counter = field(default_factory=Counter)
    cumulative: Counter = field(default_factory=Counter)
    other_files: Counter = field(default_factory=Counter)

    def add_stack(self, frames: list[str], count: int) -> None:
        """Count ``count`` samples of the stack ``frames`` (root → leaf)."""
        frames = [f for f in frames if frame_file(f)]  # py-spy's process/thread roots
        if not frames or count <= 0:
            return
        self.total += count
        step = step_of(frames)
        self.steps[step] += count
        if step == "other":  # which module: the innermost gateway frame's, else the leaf's
            files = [frame_file(f) for f in frames]
            self.other_files[next((f for f in reversed(files) if f.startswith("gateway/")),
                                  files[-1])] += count
        self.self_[frame_function(frames[-1])] += count
        for fn in {frame_function(f) for f in frames}:
            self.cumulative[fn] += count

    def add_raw(self, text: str) -> None:
        """Count every line of py-spy's raw output (``stack count``; blank lines skipped).
        Raises ``ValueError`` on a line whose last word is not a count."""
        for line in text.splitlines():
            line = line.strip()
            if not line:
                continue
            stack, _, count = line.rpartition(" ")
            self.add_stack([f for f in stack.split(";") if f], int(count))

    def merge(self, other: Profile) -> None:
        """Add ``other``'s samples to these."""
        self.total += other.total
        self.steps.update(other.steps)
        self.self_.update(other.self_)
        self.cumulative.update(other.cumulative)
        self.other_files.update(other.other_files)

    def step_shares(self) -> dict[str, float]:
        """Each of :data:`STEPS`'s share of the samples, 0..1 (they sum to 1; all 0 when
        there are no samples)."""
        return {s: self.steps[s] / self.total if self.total else 0.0 for s in STEPS}

    def top(self, n: int) -> list[dict[str, float | str]]:
        """The ``n`` functions with the most cumulative samples (the main stack's,
        :data:`MAIN_STACK_FILES`, left out): ``function``, ``self_pct``, ``cum_pct`` (percent
        of all samples), ``step`` (of the function's file)."""
        rows = []
        ranked = ((fn, c) for fn, c in self.cumulative.most_common()
                  if frame_file(fn) not in MAIN_STACK_FILES)
        for fn, cum in list(ranked)[:n]:
            file = frame_file(fn)
            rows.append({"function": fn, "step": step_of_file(file) or "other",
                         "self_pct": round(100 * self.self_[fn] / self.total, 2),
                         "cum_pct": round(100 * cum / self.total, 2)})  # fmt: skip
        return rows

    def other_top(self, n: int) -> list[dict[str, float | str]]:
        """The ``n`` files that hold most of ``other``'s samples: ``file``, ``pct`` (of all
        samples)."""
        return [{"file": f, "pct": round(100 * c / self.total, 2)}
                for f, c in self.other_files.most_common(n)]

    def top_self(self, n: int) -> list[dict[str, float | str]]:
        """The ``n`` functions with the most self samples, in :meth:`top`'s shape."""
        return [{"function": fn, "step": step_of_file(frame_file(fn)) or "other",
                 "self_pct": round(100 * c / self.total, 2),
                 "cum_pct": round(100 * self.cumulative[fn] / self.total, 2)}
                for fn, c in self.self_.most_common(n)]  # fmt: skip


def split_us(total_us: float, profile: Profile) -> dict[str, float]:
    """``total_us`` (CPU µs, measured by the kernel) split over :data:`STEPS` by the samples'
    shares; the parts sum to ``total_us`` (up to rounding to 0.1 µs)."""
    return {s: round(total_us * share, 1) for s, share in profile.step_shares().items()}


class Sampler:
    """``py-spy record`` attached to one process (and its children) until :meth:`stop`.

    ``rate``: samples per second; ``cpus``: where py-spy itself runs (never on the sampled
    process's core); ``--nonblocking``: the process is read, not paused, so its CPU figures
    are not inflated by the sampling."""

    def __init__(self, py_spy: str, pid: int, out: Path, rate: int,
                 cpus: set[int] | None = None) -> None:  # fmt: skip
        import os

        self.out = out
        cmd = [py_spy, "record", "--pid", str(pid), "--format", "raw", "--rate", str(rate),
               "--nonblocking", "--subprocesses", "-o", str(out)]  # fmt: skip
        preexec = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     preexec_fn=preexec)  # fmt: skip
        assert self.proc.stdout is not None
        first = self.proc.stdout.readline().decode(errors="replace")  # "py-spy> Sampling ..."
        if "Sampling" not in first:
            rest = self.proc.stdout.read().decode(errors="replace")
            self.proc.wait()
            raise RuntimeError(f"py-spy did not attach to {pid}: {first}{rest}")

    def stop(self) -> Profile:
        """Stop sampling (SIGINT: py-spy writes its file) and read it. Raises
        ``RuntimeError`` when py-spy wrote none."""
        import signal

        self.proc.send_signal(signal.SIGINT)
        out, _ = self.proc.communicate(timeout=30)
        if not self.out.exists():
            raise RuntimeError(f"py-spy wrote no profile: {out.decode(errors='replace')}")
        prof = Profile()
        prof.add_raw(self.out.read_text(errors="replace"))
        self.out.unlink()
        return prof

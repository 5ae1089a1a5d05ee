"""The pin journal: a small file per router of the decode KV it pins, so that no router leaves pins behind.

A decode keeps a finished turn's blocks for `decoder_kv_blocks_ttl` (480 s) unless told to free them (release.py);
only the router that holds the handle can tell it. A router that dies (SIGKILL, a crash, a node's OOM killer)
takes its handles with it, and without this file its pins would sit on the decodes for the whole TTL, starving the
next router's work. So each router writes, under `<state dir>/kv-journal/`:

    router-<pid>-<random>.journal      one JSON object a line: {"k": key, "d": decode URL, "p": params, "t": token,
                                       "x": wall-clock expiry} when a handle pins blocks, {"k": key, "-": 1} when
                                       it no longer does (read by a prefill, released, expired on the decode)

and holds an exclusive `flock` on it for its whole life. Lines are appended from memory in batches (`flush`, a few
times a second: a router killed between two flushes leaves at most that fraction of a second of pins unrecorded)
and churn within a batch cancels out before it is written. When the file holds many more lines than pins it is
rewritten (`compact`): a new file, locked before it is renamed over the old one.

At start a router takes every journal of the directory that it can lock (its previous run's, a dead sibling's),
checks it is still the file at that path (a compaction may have replaced it), reads the pins it names, deletes it,
and releases them (reason `reclaimed_at_start`); pins already past their decode's TTL are skipped. A journal it
cannot lock belongs to a live sibling (a router replica): it is left alone. The released pins sit in the new
router's own journal until their release is done, so a router that dies while reclaiming leaves them to the next.
A router that stops on purpose (SIGTERM) releases its pins first and deletes its journal when none is left.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time
import uuid
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from pdctl.router import jsonx
from pdctl.router.kv.handles import Handle

log = logging.getLogger("pdctl.router")

SUBDIR = "kv-journal"
SUFFIX = ".journal"
PRUNE_S = 10.0  # how often pins past their decode's TTL (failed releases) leave the journal
COMPACT_SLACK = 4096  # lines beyond twice the pins that a journal may hold before it is rewritten
STALE_TMP_S = 60.0  # a temporary file this old is a router's that died making it (a live one locks it in µs)
# What a release needs of a handle's params (release.release_params drops the rest).
KEPT = ("do_remote_decode", "do_remote_prefill", "remote_block_ids", "remote_engine_id", "remote_request_id",
        "remote_host", "remote_port", "tp_size", "remote_num_tokens")

Key = tuple[str, str]


@dataclass(frozen=True)
class Pinned:
    """A pin read back from a journal: what a release of it needs."""

    decode_url: str
    params: dict[str, Any]
    token: int
    expires: float  # wall clock: the decode frees the blocks by itself after this

    def handle(self, generation: int, now: float) -> Handle:
        return Handle("", dict(self.params), self.decode_url, array("i", [self.token]), now, now,
                      generation=generation)


def key_of(h: Handle) -> Key:
    return (h.decode_url, str(h.request_id))


def _entry(h: Handle, expires: float) -> dict[str, Any]:
    token = int(h.tokens[0]) if h.tokens else 0
    return {"k": list(key_of(h)), "d": h.decode_url, "p": {k: h.params[k] for k in KEPT if k in h.params},
            "t": token, "x": round(expires, 3)}


def _lock(f: IO[bytes]) -> bool:
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def read_pins(lines: Iterator[str | bytes] | list[str] | list[bytes]) -> dict[Key, Pinned]:
    """The pins a journal's lines leave standing (a torn last line, from a kill mid-write, is skipped)."""
    out: dict[Key, Pinned] = {}
    for line in lines:
        try:
            doc = jsonx.loads(line)
            key = (str(doc["k"][0]), str(doc["k"][1]))
            if doc.get("-"):
                out.pop(key, None)
            else:
                out[key] = Pinned(str(doc["d"]), dict(doc["p"]), int(doc["t"]), float(doc["x"]))
        except (ValueError, KeyError, TypeError, IndexError, jsonx.DecodeError):
            continue
    return out


class Journal:
    """This router's journal (`open` creates and locks it) and the reclaiming of dead routers' ones."""

    def __init__(self, state_dir: str, ttl: float, wall: Callable[[], float] = time.time) -> None:
        self.dir = Path(state_dir).expanduser() / SUBDIR
        self.ttl = ttl  # the decodes' decoder_kv_blocks_ttl: a pin older than that is gone by itself
        self.wall = wall
        self.path: Path | None = None
        self._file: IO[bytes] | None = None
        self._live: dict[Key, tuple[Handle, float]] = {}
        self._written: dict[Key, float] = {}  # pins the file holds -> their expiry
        self._dirty: set[Key] = set()
        self._lines = 0
        self._pruned = wall()

    def __len__(self) -> int:
        return len(self._live)

    # The table's and the releaser's hooks (kv.handles.Pins): memory only, on every turn's path.
    def pin(self, h: Handle) -> None:
        key = key_of(h)
        self._live[key] = (h, self._live[key][1] if key in self._live else self.wall() + self.ttl)
        self._dirty.add(key)

    def unpin(self, h: Handle) -> None:
        key = key_of(h)
        if self._live.pop(key, None) is not None:
            self._dirty.add(key)

    def open(self) -> dict[Key, Pinned]:
        """Create and lock this router's journal; return the pins of every journal it took over (deleted)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        taken = self._take_dead()
        self._file, self.path = self._new_file(f"router-{os.getpid()}-{uuid.uuid4().hex[:8]}{SUFFIX}")
        return taken

    def _new_file(self, name: str) -> tuple[IO[bytes], Path]:
        """A locked, empty journal at `name`: made under a temporary name, so nobody takes it before it is locked."""
        tmp = self.dir / f".{name}.{uuid.uuid4().hex[:6]}.tmp"
        f = tmp.open("wb")
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        path = self.dir / name
        os.replace(tmp, path)
        return f, path

    def _take_dead(self) -> dict[Key, Pinned]:
        taken: dict[Key, Pinned] = {}
        for path in sorted(self.dir.iterdir()):
            if path.name.endswith(".tmp"):  # a router killed while making its journal: it holds nothing yet
                with contextlib.suppress(OSError):
                    if time.time() - path.stat().st_mtime > STALE_TMP_S:
                        with path.open("rb") as f:
                            if _lock(f):
                                path.unlink()
                continue
            if not path.name.endswith(SUFFIX):
                continue
            try:
                f = path.open("rb")
            except OSError:
                continue
            with f:
                if not _lock(f):
                    log.info("journal %s is held by a live router: left alone", path.name)
                    continue
                try:
                    if os.stat(path).st_ino != os.fstat(f.fileno()).st_ino:
                        continue  # compacted into a new file since we opened it: that one is live
                except FileNotFoundError:
                    continue  # another router took it first
                pins = read_pins(f.readlines())
                path.unlink()
            now = self.wall()
            alive = {k: p for k, p in pins.items() if p.expires > now}
            log.info("took over %s: %d pin(s) an earlier router left (%d past their TTL)", path.name, len(alive),
                     len(pins) - len(alive))
            taken.update(alive)
        return taken

    def flush(self) -> None:
        """Append what changed since the last flush; rewrite the file when it has grown well past its pins."""
        if self._file is None:
            return
        now = self.wall()
        if now - self._pruned > PRUNE_S:  # a failed release's pin stays until the decode has freed it by itself
            self._pruned = now
            for key in [k for k, (_, x) in self._live.items() if x <= now]:
                del self._live[key]
                self._dirty.add(key)
        if self._dirty:
            out = []
            for key in self._dirty:
                live = self._live.get(key)
                if live is not None and key not in self._written:
                    out.append(jsonx.dumps(_entry(live[0], live[1])))
                    self._written[key] = live[1]
                elif live is None and key in self._written:
                    out.append(jsonx.dumps({"k": list(key), "-": 1}))
                    del self._written[key]
            self._dirty.clear()
            if out:
                self._file.write(b"\n".join(out) + b"\n")
                self._file.flush()
                self._lines += len(out)
        if self._lines > 2 * len(self._written) + COMPACT_SLACK:
            self.compact()

    def compact(self) -> None:
        """Rewrite the journal as the pins it holds now, less those past their TTL."""
        if self._file is None or self.path is None:
            return
        now = self.wall()
        for key in [k for k, (_, x) in self._live.items() if x <= now]:
            del self._live[key]
        f, path = self._new_file(self.path.name)
        self._written = {}
        lines = []
        for key, (h, expires) in self._live.items():
            lines.append(jsonx.dumps(_entry(h, expires)))
            self._written[key] = expires
        self._dirty.clear()
        if lines:
            f.write(b"\n".join(lines) + b"\n")
            f.flush()
        old, self._file, self.path, self._lines = self._file, f, path, len(lines)
        old.close()

    def close(self) -> None:
        """Stop: the journal goes when it holds no pin, else it stays (unlocked) for the next router."""
        if self._file is None or self.path is None:
            return
        self.flush()
        if not self._live:
            with contextlib.suppress(OSError):
                self.path.unlink()
        else:
            log.warning("leaving %d pin(s) in %s for the next router to release", len(self._live), self.path)
        self._file.close()
        self._file = None

    def stats(self) -> dict[str, object]:
        return {"path": str(self.path) if self.path else None, "pins": len(self._live),
                "written": len(self._written), "lines": self._lines}

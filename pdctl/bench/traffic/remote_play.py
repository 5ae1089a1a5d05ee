"""The bench's load player, run on the router's node: TTFT measured next to the router, not through a tunnel.

pdctl is on every node (provisioning ships it), so the player is pdctl itself: the CLI writes a play file (client
options and the conversations, with their fixed text), runs `python -m pdctl bench-play FILE OUT` there with the
node's interpreter, and reads the records back over the same transport.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import shlex
import tempfile
import uuid
from pathlib import Path
from typing import Any

from pdctl.bench.results.records import RequestRecord
from pdctl.bench.traffic.client import ClientOptions, play
from pdctl.bench.traffic.workload import Conversation, ConversationPlan
from pdctl.errors import RemoteCommandError
from pdctl.remote.base import Transport
from pdctl.remote.shell import expand_home

PLAY_TIMEOUT_S = 6 * 3600.0


def to_play(convs: list[Conversation], client: ClientOptions, leg: str) -> dict[str, Any]:
    """What the node needs to play `convs`; the API key, if any, travels inside this file (mode 0600), never argv."""
    return {
        "leg": leg,
        "client": dataclasses.asdict(client),
        "conversations": [{"id": c.conversation_id, "api": c.api, "plan": dataclasses.asdict(c.plan)} for c in convs],
    }


def from_play(data: dict[str, Any]) -> tuple[list[Conversation], ClientOptions, str]:
    client = ClientOptions(**data["client"])
    convs = []
    for item in data["conversations"]:
        p = item["plan"]
        plan = ConversationPlan(p["key"], p["length"], p["index"], _segment(p["first"]),
                                tuple(_segment(u) for u in p["users"]))
        convs.append(Conversation(plan, item["api"], item["id"]))
    return convs, client, str(data["leg"])


def _segment(value: Any) -> str | tuple[int, ...]:
    return value if isinstance(value, str) else tuple(int(x) for x in value)


def play_file(play_path: Path, out_path: Path) -> int:
    """`pdctl bench-play`: play the file's conversations against its router URL; write the records as JSON."""
    convs, client, leg = from_play(json.loads(play_path.read_text()))
    records = asyncio.run(play(convs, client, leg))
    tmp = out_path.with_name(out_path.name + ".tmp")
    tmp.write_text(json.dumps([r.to_json() for r in records]))
    tmp.replace(out_path)
    return len(records)


def play_on_node(
    transport: Transport, python: str, run_dir: str, convs: list[Conversation], client: ClientOptions, leg: str
) -> list[RequestRecord]:
    """Play `convs` on `transport`'s host and bring the records back; the files are removed afterwards."""
    stem = f"{run_dir}/bench/play-{uuid.uuid4().hex[:10]}"
    with tempfile.TemporaryDirectory() as tmp:
        local = Path(tmp) / "play.json"
        local.write_text(json.dumps(to_play(convs, client, leg)))
        local.chmod(0o600)
        transport.put(local, f"{stem}.json")
    try:
        res = transport.run([python, "-m", "pdctl", "bench-play", f"{stem}.json", f"{stem}.out.json"],
                            timeout=PLAY_TIMEOUT_S)
        if not res.ok:
            tail = "\n".join((res.stderr or res.stdout).splitlines()[-10:])
            raise RemoteCommandError(transport.name, f"{python} -m pdctl bench-play", res.exit_code, tail,
                                     hint="is pdctl installed in the node's venv? (`pdctl up` provisions it); "
                                     "or play from here with --client local")
        text = transport.read_text(f"{stem}.out.json", max_bytes=1 << 30)
    finally:
        transport.run(f"rm -f {expand_home(stem + '.json')} {expand_home(stem + '.out.json')}", timeout=30.0)
    if text is None:
        raise RemoteCommandError(transport.name, f"cat {shlex.quote(stem)}.out.json", 1, "no records were written")
    return [RequestRecord.from_json(r) for r in json.loads(text)]

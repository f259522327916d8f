"""The external oracle: a side-effect sink in a process of its own (reliability plan 4.5).

``python -m tests.support.sink LOG PORT`` serves:

* ``POST /effects/<key>`` with JSON ``{"token": n, "fence": f, "pid": p}``: the "provider
  call" (``token`` attributes it to a lease, ``fence`` is the key's dispatch number). Every
  call is appended to LOG (JSONL, O_APPEND + fsync) *before* anything else, so nothing
  the system under test does can hide a duplicate. Keys starting ``fenced-`` are
  checked like a fencing-aware provider would: a fence lower than the highest one seen
  for the key is refused (409) and logged as refused. Keys starting ``ackloss-`` (or
  ``fenced-ackloss-``: both at once) are
  *ack-loss* calls: accepted and logged, then the connection is closed before any reply
  (the provider did it; the caller cannot know).
* ``GET /effects/<key>``: the provider's lookup, for reconcilers: 200 with the calls
  accepted for the key, or 404. ``GET /effects/<key>?fence=f`` fences the lookup (for
  ``fenced-`` keys): from then on a call with fence ``f`` or lower is refused, so that a
  "not found" stays true (a call delayed past the lookup cannot land later).

It is deliberately not idempotent: two calls are two lines.
"""

from __future__ import annotations

import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from threading import Lock

_lock = Lock()
_highest: dict[str, int] = {}


def _append(log: str, entry: dict[str, object]) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(entry) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def _accepted(log: str, key: str) -> list[dict[str, object]]:
    if not os.path.exists(log):
        return []
    with open(log) as lines:
        entries = [json.loads(line) for line in lines if line.strip()]
    return [e for e in entries if e["key"] == key and e["outcome"] == "accepted"]


class Handler(BaseHTTPRequestHandler):
    log_path = ""

    def log_message(self, format: str, *args: object) -> None:  # quiet: the log file is the record
        pass

    def _key(self) -> str:
        return self.path.removeprefix("/effects/")

    def _reply(self, status: int, body: dict[str, object]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        key = self._key()
        length = int(self.headers.get("Content-Length") or 0)
        request = json.loads(self.rfile.read(length) or b"{}")
        token = int(request.get("token") or 0)
        fence = int(request.get("fence") or 0)
        with _lock:
            refused = key.startswith("fenced-") and fence < _highest.get(key, 0)
            if not refused:
                _highest[key] = max(fence, _highest.get(key, 0))
            entry = {
                "key": key, "token": token, "fence": fence, "pid": request.get("pid"),
                "task_id": request.get("task_id"), "t": time.time(),
                "outcome": "refused" if refused else "accepted",
            }  # fmt: skip
            _append(self.log_path, entry)
        if key.startswith(("ackloss-", "fenced-ackloss-")):
            self.close_connection = True  # the effect happened; the reply is lost
            return
        if refused:
            self._reply(409, {"error": f"stale fence {fence}"})
        else:
            self._reply(200, {"id": f"{key}#{token}"})

    def do_GET(self) -> None:
        key, _, query = self._key().partition("?")
        fence = int(query.removeprefix("fence=")) if query.startswith("fence=") else 0
        with _lock:
            if key.startswith("fenced-") and fence:
                _highest[key] = max(fence + 1, _highest.get(key, 0))
            calls = _accepted(self.log_path, key)
            found = bool(calls)
        if found:
            self._reply(200, {"found": True, "calls": calls})
        else:
            self._reply(404, {"found": False})


def main() -> None:
    log, port = sys.argv[1], int(sys.argv[2])
    Handler.log_path = log
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    print(f"sink ready on {port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()

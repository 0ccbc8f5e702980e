"""An adopted llama-protocol server that is still loading its model: /health
answers 503 "Loading model" (llama-server's nested form) until the file
``serve`` appears in the working directory, then 200. Each loading answer
appends a line to ``loading_answers`` first, so a test knows how often it
was asked while it loaded without sleeping. Takes llama-server's flags.
"""

from __future__ import annotations

import threading
from pathlib import Path

from fault_common import LOADING, Handler, parse_args, serve

_LOCK = threading.Lock()


class StillLoading(Handler):
    """Loading until ``serve`` exists; every other route as the shared handler."""

    def health(self) -> None:
        if Path("serve").exists():
            self.reply(200, {"status": "ok"})
            return
        with _LOCK, Path("loading_answers").open("a") as out:
            out.write("503\n")
        self.reply(503, LOADING)


def main() -> None:
    serve(parse_args(), StillLoading)


if __name__ == "__main__":
    main()

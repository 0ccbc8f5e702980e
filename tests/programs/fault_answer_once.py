"""Answer /health 200 once, then exit (code 1) one second later.

Every later /health gets 503 "shutting down". A server that comes up, passes
its first probe and dies: each run looks ready, none stays up.
"""

from __future__ import annotations

import os
import threading

from fault_common import Handler, parse_args, serve

EXIT_AFTER_S = 1.0


class AnswerOnce(Handler):
    answered = threading.Lock()

    def health(self) -> None:
        if not AnswerOnce.answered.acquire(blocking=False):
            self.reply(503, {"error": {"code": 503, "message": "shutting down"}})
            return
        self.reply(200, {"status": "ok"})
        threading.Timer(EXIT_AFTER_S, lambda: os._exit(1)).start()


if __name__ == "__main__":
    serve(parse_args(), AnswerOnce)

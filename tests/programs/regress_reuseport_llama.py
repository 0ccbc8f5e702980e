"""A llama-protocol server whose listening socket sets SO_REUSEPORT, so another
program (tests/programs/owner_listen.py) can listen on 0.0.0.0 with the same port.

Takes llama-server's flags; /health follows the ``health`` file (see fault_common).
"""

from __future__ import annotations

from http.server import ThreadingHTTPServer

from fault_common import Handler, parse_args


class ReusePortServer(ThreadingHTTPServer):
    allow_reuse_address = True
    allow_reuse_port = True
    daemon_threads = True


if __name__ == "__main__":
    args = parse_args()
    Handler.alias = args.alias
    ReusePortServer((args.host, args.port), Handler).serve_forever()

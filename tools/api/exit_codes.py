"""The control API's error codes and the exit status each gives: the table the
command line follows (its exit statuses and the codes of ``--json``).

It lives with the API because the API's answers carry these codes
(tools/api/errors.py); the command line, a client of the API, maps a code to
its exit status here, so the API depends on nothing of the command line. One
table for the whole command line (documented in docs/cli.md and in each
command's ``--help``)::

    0  done, or already so (a start of a running instance, a stop of a stopped one)
    1  refused or invalid: the node refused the verb, the instance is unknown or
       ambiguous, the chain does not verify or cannot be replayed, a demo step failed
    2  usage: the command line is wrong (unknown option, a bad value, a path that
       names no data directory, config or chain, a config that cannot be used)
    3  no node takes verbs there (none runs on the data directory or listens at
       the URL, or it is still starting, or shutting down): try again once
       `infervisor run` is up
    4  no answer (code ``no_answer``): the node is there (it took the connection)
       but did not answer within --timeout (its process stopped: `kill -CONT PID`;
       frozen; overloaded), or it went away (crashed, restarted) before it
       answered; a verb it was sent may have been taken: look with `infervisor
       status` once the node answers before asking again
  141  standard output closed early: its reader went away (``status | head -1``);
       said by nothing (no message, no JSON error), as a program SIGPIPE ends
       (tools/clikit/closed_stdout.py)

``status INSTANCE --check`` and ``health INSTANCE --check`` (like ``systemctl
is-active``): 0 when INSTANCE is running and healthy, 1 otherwise, 3 when no
node runs, 4 when it does not answer.

The command line's own codes (``usage``, ``bad_path``, ``chain_invalid``, ...) are
in the same table, so an answer's ``code`` gives the exit status directly.

With ``--json`` an error is also printed on stdout as one object,
``{"error": {"code": CODE, "message": MESSAGE, "field": FLAG_OR_NULL}}``;
``CODE`` is one of :data:`CODES` and determines the exit status.
"""

from __future__ import annotations

import enum
import re

__all__ = ["CODES", "EPILOG", "Exit", "cut", "exit_for"]


class Exit(enum.IntEnum):
    """Exit statuses."""

    OK = 0
    REFUSED = 1
    USAGE = 2
    NO_NODE = 3
    NO_ANSWER = 4
    #: Standard output was closed before all was written (``status | head -1``):
    #: 128 + SIGPIPE, what the shell reports of a program SIGPIPE ends; no error
    #: code, no message (tools/clikit/closed_stdout.py).
    CLOSED_STDOUT = 141


#: Every error code and the exit status it gives.
CODES: dict[str, Exit] = {
    "usage": Exit.USAGE,
    "bad_value": Exit.USAGE,
    "bad_path": Exit.USAGE,
    "bad_config": Exit.USAGE,
    "no_chain": Exit.USAGE,
    "chain_unreadable": Exit.USAGE,
    "bad_key": Exit.USAGE,
    "bad_spec": Exit.USAGE,
    "bad_request": Exit.USAGE,
    "unsupported_media_type": Exit.USAGE,
    "unauthorized": Exit.USAGE,
    "unknown_instance": Exit.REFUSED,
    "ambiguous_instance": Exit.REFUSED,
    "invalid_state": Exit.REFUSED,
    "invalid": Exit.REFUSED,
    "refused": Exit.REFUSED,
    "admission_refused": Exit.REFUSED,
    "no_room": Exit.REFUSED,
    "queue_full": Exit.REFUSED,
    "memory_budget": Exit.REFUSED,  # no_room's name before stop 30 (an older node's answer)
    "spawn_failed": Exit.REFUSED,
    "start_failed": Exit.REFUSED,
    "timeout": Exit.REFUSED,
    "chain_invalid": Exit.REFUSED,
    "chain_unreplayable": Exit.REFUSED,
    "checkpoint_invalid": Exit.REFUSED,
    "no_checkpoint": Exit.REFUSED,
    "node_error": Exit.REFUSED,
    "port_taken": Exit.REFUSED,
    "forbidden": Exit.REFUSED,
    "probe_failed": Exit.REFUSED,
    "idempotency_mismatch": Exit.REFUSED,
    "idempotency_in_flight": Exit.REFUSED,
    "record_failed": Exit.REFUSED,
    "verb_failed": Exit.REFUSED,
    "not_found": Exit.REFUSED,
    "method_not_allowed": Exit.REFUSED,
    "no_node": Exit.NO_NODE,
    "node_starting": Exit.NO_NODE,
    "node_stopping": Exit.NO_NODE,
    "node_unreachable": Exit.NO_NODE,
    "no_answer": Exit.NO_ANSWER,
    "body_too_large": Exit.USAGE,
    "too_large": Exit.USAGE,  # body_too_large's name before stop 35 (an older node's answer)
    "bad_framing": Exit.USAGE,
    "too_many_connections": Exit.NO_NODE,
    "request_timeout": Exit.NO_NODE,
    "cordoned": Exit.REFUSED,
    "stale_generation": Exit.REFUSED,
    "beyond_head": Exit.REFUSED,
}

#: The table as each command's --help ends with it.
EPILOG = (
    "Exit status (every command): 0 done or already so; 1 refused or invalid "
    "(unknown instance, a refusal of the node, a chain that does not verify); "
    "2 usage (bad option, value, path, spec or token); 3 no node takes verbs "
    "there (none runs, or it is starting or shutting down); 4 no answer: the node "
    "is there but did not answer within --timeout (stopped: kill -CONT PID), or went "
    "away, before answering a verb it may have taken (see status); "
    "141 standard output closed early (| head), said by nothing."
)

#: Longest value quoted whole in a message; longer ones are cut with an ellipsis.
MAX_VALUE = 200
_LONG = re.compile(rf"\S{{{MAX_VALUE + 1},}}")
#: Longest message said whole: a value with spaces (a 100 KB ``role`` of short
#: words) is not one long word, so the message as a whole is cut after this many.
MAX_MESSAGE = 2000


def exit_for(code: str) -> Exit:
    """The exit status of an error code (1 for a code not in the table)."""
    return CODES.get(code, Exit.REFUSED)


def cut(message: str) -> str:
    """``message`` with every word longer than MAX_VALUE characters cut, ending in ``…``,
    and the whole cut after MAX_MESSAGE characters (``… (N characters in all)``)."""
    message = _LONG.sub(lambda m: m[0][:MAX_VALUE] + "…", message)
    if len(message) <= MAX_MESSAGE:
        return message
    return f"{message[:MAX_MESSAGE]}… ({len(message)} characters in all)"

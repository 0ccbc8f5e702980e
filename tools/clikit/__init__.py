"""What every command of the ``infervisor`` command line shares.

One error path (:mod:`.failure`: a message on stderr, one JSON object on
stdout under ``--json``, the exit status of the code), the command class
whose ``--help`` ends with the exit table and the parameter types
(:mod:`.command`), naming an instance by id or role (:mod:`.names`), and the
typed records the command line prints as JSON (:mod:`.schemas`). Nothing here
imports another subpackage of ``tools`` but ``tools.api``'s wire types.
"""

"""The operator's verbs: clients of the running node's control API.

Each command is declared in the module with its body: ``status``
(:mod:`.status`), ``place`` (:mod:`.place`), ``start``, ``stop``,
``restart`` and ``unload`` (:mod:`.verbs`), ``logs`` (:mod:`.logs`),
``watch`` (:mod:`.watch`) and ``health`` (:mod:`.health`). :mod:`.target`
finds the node (WHERE's socket, or --url and a token) and turns the API's
errors into the exit table; :mod:`.progress` shows a blocking verb's wait on
a terminal.
"""

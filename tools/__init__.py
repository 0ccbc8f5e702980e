"""infervisor.tools: the command line and the control API, split by who uses them.

:mod:`.cli` is the root ``infervisor`` group; it adds the commands of
:mod:`.operator` (the operator's verbs, clients of the API), :mod:`.audit`
(offline reads of a chain file), :mod:`.node` (``infervisor run`` and its
config) and :mod:`.demo`. :mod:`.clikit` is what every command shares,
:mod:`.servers` the launcher and tiny-model generators, and :mod:`.api` the
control API the node serves.
"""

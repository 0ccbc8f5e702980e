"""``infervisor fleet``: follow many nodes through their APIs, witness their chains.

One TOML file names the nodes (:mod:`.config`); the fleet keeps its own
SQLite store of every node's events and the last checkpoint it verified of
each (:mod:`.store`); :mod:`.follow` mirrors a node's event stream into it,
checking each event's link; :mod:`.witness` checks a node's newest signed
checkpoint against the one it verified before; :mod:`.command` is the command
line (``status``, ``place``, ``drain``, ``check``, ``serve``).
"""

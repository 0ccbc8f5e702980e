"""``infervisor run``: a node in the foreground, and the configuration it runs from.

:mod:`.config` reads and checks the TOML config; :mod:`.run` declares the
command and runs the node until a signal; :mod:`.boot` does what comes before
the node opens (preflight, the run lock of :mod:`.lock`, logging, the API's
listeners), :mod:`.models` registers the configured models, and
:mod:`.placing` places the configured instances the chain does not know.
:mod:`.where` turns the WHERE argument of every other command (a data
directory, a config file or a chain file) into a data directory and a chain.
"""

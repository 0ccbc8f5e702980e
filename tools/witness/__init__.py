"""``infervisor witness``: a C2SP tlog-witness server (c2sp.org/tlog-witness).

- :mod:`.config`: the TOML config, the logs witnessed, the cosigner key;
- :mod:`.store`: the per-origin state in SQLite (compare-and-swap, fsynced);
- :mod:`.service`: add-checkpoint and monitoring answers, the ``--audit`` seam;
- :mod:`.app`: the ASGI app; :mod:`.server`: uvicorn on a TCP socket;
- :mod:`.command`: the commands.

The wire format itself is :mod:`infervisor.chain.witness_protocol`.
"""

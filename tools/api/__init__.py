"""The node's HTTP control API: the wire types, the server, the client.

``infervisor run`` serves it on ``<data_dir>/api.sock`` (and optionally on a
loopback TCP port with bearer tokens); the command line is its client.
docs/api.md describes it and docs/openapi.json is its OpenAPI document.
"""

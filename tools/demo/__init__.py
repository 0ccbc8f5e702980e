"""``infervisor demo``: the main job end to end, offline, for a newcomer.

:mod:`.command` declares the command (its options, the folder it works in,
the printed report); :mod:`.steps` runs the steps on a real server and a
tiny generated model, and is imported only when the demo runs.
"""

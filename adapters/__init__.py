"""What talks to the outside world: specs, the model registry, launches, processes, probes.

Plain synchronous code: nothing here knows about actors or the chain.
"""

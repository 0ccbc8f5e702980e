"""infervisor.actors."""

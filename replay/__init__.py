"""infervisor.replay."""

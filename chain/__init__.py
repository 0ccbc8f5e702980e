"""infervisor.chain."""

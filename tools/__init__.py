"""infervisor.tools."""

"""The decision core: pure rules from sourced state and one observation."""

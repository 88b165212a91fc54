"""Adapters: translate a library's conventions and refusals into the contract's (CONTRACT section 1)."""

"""Adapters: translate a library's conventions and refusals into the contract's (docs/CONTRACT.md "1. Surface and signatures")."""

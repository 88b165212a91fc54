"""The conformance suite: the checks an implementation under test is judged by (one module per area)."""

"""Runs from a clone load the suite's pytest plugin (options, profiles, the report)."""
pytest_plugins = ["attention_oracle.plugin"]

"""The suite's own tests of its oracle floor."""

"""The suite's own tests of its tools floor."""

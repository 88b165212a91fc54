"""The suite's own tests of its run floor."""

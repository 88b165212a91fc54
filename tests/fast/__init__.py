"""The suite's own tests of its fast floor."""

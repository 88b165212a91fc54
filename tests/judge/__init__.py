"""The suite's own tests of its judge floor."""

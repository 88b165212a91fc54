"""The harness every check runs through: cases, layouts, targets, the agreement rule, the runner, profiles, the report."""

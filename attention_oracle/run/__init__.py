"""Running checks: the runner, fuzzing (example database, corpus), poisoned allocations, GPU
placement, known failures, triage, the report and the baseline."""

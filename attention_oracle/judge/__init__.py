"""The judge: the agreement rule, the Judge every verdict goes through, Cases, layouts, capability
declarations, targets (implementations under test) and the adapters for foreign conventions."""

"""Tools: replay of a printed case, the SDPA dispatch table, the calibration report."""

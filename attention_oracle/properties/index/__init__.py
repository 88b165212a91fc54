"""Varlen index preparation (offset_gather_kv_indices): cases and checks."""

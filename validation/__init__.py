"""Validation: NeMo log parsing, 50 -> 1000 step extrapolation, design-guide tables and plots."""

"""A verb's cells: sweeps expanded, every cell prepared (checked and rendered in memory) before any is written; a run dir checked against its render."""

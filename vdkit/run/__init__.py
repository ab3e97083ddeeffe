"""Run directories and runs: file names and load_plan, the job contract, faults, the run-dir lock, runs listed and controlled."""

"""Composition: the recipe's types (schema), Hydra composition and its search path, conf/ files, sweep files, size limits, site facts."""

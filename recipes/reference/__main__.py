"""``python -m vdkit.recipes.reference RUN_DIR``: what each rank runs."""
import sys

from vdkit.recipes.reference.train import main

sys.exit(main())

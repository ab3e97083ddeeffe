import sys

from vdkit.cli import main

sys.exit(main())

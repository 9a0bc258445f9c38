import sys

from oelm.cli import main

sys.exit(main())

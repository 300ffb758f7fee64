import sys

from kgen.cli import main

sys.exit(main())

import sys

from qualify.cli import main

sys.exit(main())

import sys

from qualify.probe.cli import main

sys.exit(main())

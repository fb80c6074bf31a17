import sys

from maskstream.cli import main

sys.exit(main())

import sys

from maskstream.cli import run

sys.exit(run())

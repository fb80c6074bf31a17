import gc
import sys

from maskstream.cli import main

status = main()
# The process ends here: Python's last cyclic collection at exit would walk the millions of objects
# torch and transformers keep alive (1.3 s measured after an update that loaded the encoder) only to
# free memory the OS takes back anyway. Frozen objects are left out of it; finalizers still run.
gc.freeze()
sys.exit(status)

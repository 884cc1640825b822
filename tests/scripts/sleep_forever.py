"""Every rank hangs (as in a collective that never completes)."""
import time

import deepspeed

deepspeed.init_distributed()
while True:
    time.sleep(1)

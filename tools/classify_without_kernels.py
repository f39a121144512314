"""`trtmc` (a `classify`, say) as a bundle built before it carried trtmc's compiled Triton kernels would load: the bundle's
archive of them is not put back into Triton's cache (`trtmc.backends.triton_cache.restore` does nothing), so a
fresh Triton cache compiles them at the first call. The comparison for a load that puts them back
(`tools/gpu_session.sh coldkernel`).

    PYTHONPATH=src python3 tools/classify_without_kernels.py -v classify BUNDLE IMAGE --compiled
"""

import sys

from trtmc.backends import triton_cache
from trtmc.cli import main

triton_cache.restore = lambda data: triton_cache.Restored(put=0, archived=0)
sys.exit(main(sys.argv[1:]))

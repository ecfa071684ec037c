import os

import torch

# Triton decides interpret-vs-compile when a kernel is defined, so this must run before any
# kernels.triton_* module is imported. With a GPU the kernels compile and run on CUDA.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

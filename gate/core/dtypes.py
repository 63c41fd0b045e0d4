"""The dtypes a policy may name (`target.dtype`, a draft's `dtype`, a trained head file's
`dtype`) and the torch dtype each means."""

from __future__ import annotations

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

"""SIMULATED compute for a capture of real Triton traces: 5 ms of sleep per request."""
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            time.sleep(0.005)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", (x * 2).astype(np.float32))]))
        return out

"""Decoupled: 5 responses per request, 4 ms of (SIMULATED) work before each."""
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for r in requests:
            sender = r.get_response_sender()
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            for i in range(5):
                time.sleep(0.004)
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", (x + i).astype(np.float32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None

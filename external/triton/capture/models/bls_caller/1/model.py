"""BLS: 1 ms of its own (SIMULATED) work, then sleep_8ms called with trace=request.trace()
(server docs/user_guide/trace.md, "Tracing for BLS models")."""
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0")
            time.sleep(0.001)
            child = pb_utils.InferenceRequest(
                model_name="sleep_8ms", requested_output_names=["OUTPUT0"], inputs=[x], trace=r.trace()
            )
            res = child.exec()
            if res.has_error():
                raise pb_utils.TritonModelException(res.error().message())
            out.append(pb_utils.InferenceResponse([pb_utils.get_output_tensor_by_name(res, "OUTPUT0")]))
        return out

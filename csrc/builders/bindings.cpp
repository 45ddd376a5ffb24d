// The native builders' private entry points; pinstage/builders calls them for backend="pinstage".
#include "native_builders.h"

namespace py = pybind11;

namespace pinstage::builders {

void bind_native_builders(py::module_& m) {
  m.def("_stage_decode_inputs", &stage_decode_inputs, py::arg("requests"), py::arg("last_tokens_only"),
        py::arg("stream"), py::arg("device"));
  m.def("_stage_sampling_batch", &stage_sampling_batch, py::arg("params"), py::arg("with_seeds"),
        py::arg("top_k_all"), py::arg("default_seed"), py::arg("stream"), py::arg("device"));
  m.def("_stage_logprob_indices", &stage_logprob_indices, py::arg("extend_seq_lens"),
        py::arg("extend_logprob_start_lens"), py::arg("stream"), py::arg("device"));
}

}  // namespace pinstage::builders

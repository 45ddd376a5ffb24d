// stage_to_device as a plain METH_FASTCALL function of four positional arguments (data, dtype,
// stream, device); pinstage._api gives it its signature. It is the call engines make most, and
// pybind11's dispatcher adds about 0.4 us to it (measured against this entry on a CPU build,
// where the whole call of one value takes about 0.7 us).
#pragma once

#include <Python.h>

namespace pinstage {

extern PyMethodDef kStageToDeviceEntry;

}  // namespace pinstage

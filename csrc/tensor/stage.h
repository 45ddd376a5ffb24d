// The staging operations: Python data -> convert -> ring region -> one async copy -> device tensor.
// Arguments are the raw Python objects so that the bindings add no conversions of their own.
#pragma once

#include <ATen/core/Tensor.h>
#include <Python.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "convert/item_plan.h"
#include "copy/target.h"
#include "python/py_objects.h"

namespace pinstage {

at::Tensor stage_to_device(PyObject* data, PyObject* dtype, PyObject* stream, PyObject* device);
std::vector<at::Tensor> stage_many(PyObject* items, PyObject* stream, PyObject* device);
// Fills the tensor `out` (a torch.Tensor object); the binding hands the caller's object back.
void stage_into(PyObject* data, PyObject* out, PyObject* stream);

// A kernel that takes the place of a staging's copy on a device (stage_prefill's cache rows): it
// needs `ring_bytes` more of the staging's ring region, after the items, and launch() enqueues it on
// the stream; it has the items' `bytes` copied from `region` (mapped pinned memory; item i at
// item_offsets[i]) to `device` and does its own work, reading its part of the region at `own`.
// launch() throws only before it launches (nothing is then enqueued) and returns the launch's
// cudaError_t.
struct KernelForCopy {
  size_t ring_bytes = 0;
  std::function<int(const uint8_t* region, const size_t* item_offsets, size_t bytes, void* device, uint8_t* own,
                    void* stream)>
      launch;
};

// stage_many's parts, for calls that stage more with the caller's items. check_items_sequence
// names items that are no sequence; callers run it before resolving the device, so that bad items
// are named first. plan_many plans each (data, dtype) pair of `items` in order, holding its data in
// `held` for the call; errors name the item and the call, `pinstage.<api>` (api is the short name,
// as "stage_many"). stage_plans stages the plans on `target` (one ring region and one copy on a
// device, or `kernel` in place of the copy where given: a device target only) and returns a tensor
// per plan; errors while writing name the item where api is not null.
void check_items_sequence(PyObject* items, const char* api);
std::vector<ItemPlan> plan_many(PyObject* items, const char* api, std::vector<THPObjectPtr>& held);
std::vector<at::Tensor> stage_plans(std::vector<ItemPlan>& plans, const Target& target, const char* item_api,
                                    const KernelForCopy* kernel = nullptr);

}  // namespace pinstage

#include "cpu_allocator.h"

#include <c10/core/CPUAllocator.h>

#include <stdexcept>

#include "adopt.h"
#include "backward_scopes.h"
#include "ops.h"

namespace allocscope::cpu {
namespace {

c10::DeleterFnPtr g_inner_deleter = nullptr;

void delete_fast(void* ptr) {
  record_free(ptr, format::kCpuStream);
  g_inner_deleter(ptr);
}

void delete_boxed(void* ctx) {
  auto* box = static_cast<BoxedDataPtr*>(ctx);
  record_free(box->inner.get(), format::kCpuStream);
  delete box;
}

class RecordingCPUAllocator final : public c10::Allocator {
 public:
  explicit RecordingCPUAllocator(c10::Allocator* inner) : inner_(inner) {}

  c10::DataPtr allocate(size_t n) override {
    EmitScope scope;
    if (!scope) return inner_->allocate(n);
    backward_scopes::sync(scope);
    ops::Current op = ops::current();
    uint32_t stack = op.forward_stack != 0 ? op.forward_stack : Recorder::get().capture_stack();
    int64_t t0 = now_ns();
    c10::DataPtr d = inner_->allocate(n);
    int64_t t1 = now_ns();
    if (d.get() == nullptr) return d;
    adopt(d, g_inner_deleter, &delete_fast, &delete_boxed);
    RawEvent ev;
    ev.kind = format::kAlloc;
    ev.addr = reinterpret_cast<uintptr_t>(d.get());
    ev.size = n;
    ev.stack = stack;
    ev.op = op.op;
    ev.arg = static_cast<uint64_t>(t1 - t0);
    ev.time_ns = t1;
    ev.stream = format::kCpuStream;
    scope.push(ev);
    return d;
  }

  c10::DeleterFnPtr raw_deleter() const override {
    return g_inner_deleter != nullptr ? &delete_fast : nullptr;
  }

  void copy_data(void* dest, const void* src, size_t count) const override {
    inner_->copy_data(dest, src, count);
  }

  bool is_simple_data_ptr(const c10::DataPtr& data_ptr) const override {
    return inner_->is_simple_data_ptr(data_ptr);
  }

  c10::Allocator* inner() const { return inner_; }

 private:
  c10::Allocator* inner_;
};

RecordingCPUAllocator* g_wrapper = nullptr;  // leaked: its deleters outlive everything
uint8_t g_priority = 0;

}  // namespace

void install() {
  c10::Allocator* current = c10::GetCPUAllocator();
  if (g_wrapper != nullptr && current == g_wrapper) return;
  if (g_wrapper == nullptr) {
    g_inner_deleter = current->raw_deleter();
    g_wrapper = new RecordingCPUAllocator(current);
  } else if (g_wrapper->inner() != current) {
    throw std::runtime_error(
        "the CPU allocator was replaced after allocscope first wrapped it; allocscope can only record the "
        "CPU allocator that was current at its first recording in this process");
  }
  g_priority = set_at_lowest_priority(
      g_wrapper, [] { return c10::GetCPUAllocator(); },
      [](c10::Allocator* a, uint8_t p) { c10::SetCPUAllocator(a, p); });
}

void uninstall() {
  if (g_wrapper != nullptr && c10::GetCPUAllocator() == g_wrapper) {
    c10::SetCPUAllocator(g_wrapper->inner(), g_priority);
  }
}

bool installed() {
  return g_wrapper != nullptr && c10::GetCPUAllocator() == g_wrapper;
}

}  // namespace allocscope::cpu

#include "pystack.h"

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <frameobject.h>

#include <atomic>
#include <cstring>

// The interpreter-frame layouts of the CPython versions we read without the
// GIL, copied from Include/internal/pycore_frame.h of each release (the
// internal headers do not compile as C++, so the prefix we read is mirrored).
// Only fields up to `owner` are declared; only code, previous, the instruction
// pointer and owner are read. self_check() verifies them at run time.
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030E0000 && !defined(Py_GIL_DISABLED)
#define ALLOCSCOPE_INTERNAL_WALKER 1
#else
#define ALLOCSCOPE_INTERNAL_WALKER 0
#endif

namespace allocscope::pystack {
namespace {

constexpr char kOwnedByGenerator = 1;
[[maybe_unused]] constexpr char kOwnedByCStack = 3;  // 3.12+: shim frames

#if ALLOCSCOPE_INTERNAL_WALKER
#if PY_VERSION_HEX < 0x030C0000
struct InterpreterFrame {  // 3.11
  PyObject* f_func;
  PyObject* f_globals;
  PyObject* f_builtins;
  PyObject* f_locals;
  PyCodeObject* f_code;
  PyObject* frame_obj;
  InterpreterFrame* previous;
  uint16_t* prev_instr;
  int stacktop;
  bool is_entry;
  char owner;
};
#elif PY_VERSION_HEX < 0x030D0000
struct InterpreterFrame {  // 3.12
  PyCodeObject* f_code;
  InterpreterFrame* previous;
  PyObject* f_funcobj;
  PyObject* f_globals;
  PyObject* f_builtins;
  PyObject* f_locals;
  PyObject* frame_obj;
  uint16_t* prev_instr;
  int stacktop;
  uint16_t return_offset;
  char owner;
};
#else
struct InterpreterFrame {  // 3.13
  PyObject* f_executable;
  InterpreterFrame* previous;
  PyObject* f_funcobj;
  PyObject* f_globals;
  PyObject* f_builtins;
  PyObject* f_locals;
  PyObject* frame_obj;
  uint16_t* instr_ptr;
  int stacktop;
  uint16_t return_offset;
  char owner;
};
#endif

inline InterpreterFrame* current_frame(PyThreadState* ts) {
#if PY_VERSION_HEX < 0x030D0000
  return ts->cframe ? reinterpret_cast<InterpreterFrame*>(ts->cframe->current_frame) : nullptr;
#else
  return reinterpret_cast<InterpreterFrame*>(ts->current_frame);
#endif
}

int walk_internal(RawFrame* out, int max_depth) {
  // Reads the thread state's TSS slot: safe without the GIL.
  PyThreadState* ts = PyGILState_GetThisThreadState();
  if (ts == nullptr) return 0;
  int depth = 0;
  for (InterpreterFrame* f = current_frame(ts); f != nullptr && depth < max_depth; f = f->previous) {
#if PY_VERSION_HEX >= 0x030C0000
    if (f->owner == kOwnedByCStack) continue;
#endif
#if PY_VERSION_HEX < 0x030D0000
    PyCodeObject* code = f->f_code;
    const uint16_t* instr = f->prev_instr;
#else
    if (f->f_executable == nullptr || Py_TYPE(f->f_executable) != &PyCode_Type) continue;
    PyCodeObject* code = reinterpret_cast<PyCodeObject*>(f->f_executable);
    const uint16_t* instr = f->instr_ptr;
#endif
    const uint16_t* first = reinterpret_cast<const uint16_t*>(code->co_code_adaptive);
    // An incomplete frame (still in its prologue) is invisible to Python too.
    if (f->owner != kOwnedByGenerator && instr < first + code->_co_firsttraceable) continue;
    out[depth++] = RawFrame{code, static_cast<int32_t>(instr - first)};
  }
  return depth;
}
#endif  // ALLOCSCOPE_INTERNAL_WALKER

// Requires the GIL.
int walk_public(RawFrame* out, int max_depth) {
  PyFrameObject* f = PyEval_GetFrame();
  Py_XINCREF(f);
  int depth = 0;
  while (f != nullptr && depth < max_depth) {
    PyCodeObject* code = PyFrame_GetCode(f);
#if PY_VERSION_HEX >= 0x030B0000
    int lasti = PyFrame_GetLasti(f);
    int32_t instr = lasti < 0 ? -1 : lasti / 2;  // bytes -> code units
#else
    int32_t instr = PyFrame_GetLineNumber(f);
#endif
    // The running frame keeps its code alive; the pointer is only a key.
    out[depth++] = RawFrame{code, instr};
    Py_DECREF(code);
    PyFrameObject* back = PyFrame_GetBack(f);
    Py_DECREF(f);
    f = back;
  }
  Py_XDECREF(f);
  return depth;
}

bool finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

std::string utf8(PyObject* s) {
  if (s == nullptr || !PyUnicode_Check(s)) return "?";
  Py_ssize_t n = 0;
  const char* p = PyUnicode_AsUTF8AndSize(s, &n);
  if (p == nullptr) {
    PyErr_Clear();
    return "?";
  }
  return std::string(p, static_cast<size_t>(n));
}

}  // namespace

bool internal_walker_compiled() {
  return ALLOCSCOPE_INTERNAL_WALKER != 0;
}

namespace {
// Appended under the GIL, read without it: a slot is written before the count
// that publishes it.
const void* g_hidden[kMaxHidden];
std::atomic<int> g_hidden_count{0};

bool hidden(const void* code, int count) {
  for (int i = 0; i < count; ++i) {
    if (g_hidden[i] == code) return true;
  }
  return false;
}

int without_hidden(RawFrame* out, int depth) {
  int count = g_hidden_count.load(std::memory_order_acquire);
  if (count == 0) return depth;
  int skip = 0;
  while (skip < depth && hidden(out[skip].code, count)) ++skip;
  if (skip > 0) std::memmove(out, out + skip, sizeof(RawFrame) * (depth - skip));
  return depth - skip;
}
}  // namespace

bool hide(const void* code) {
  int count = g_hidden_count.load(std::memory_order_relaxed);
  if (hidden(code, count)) return true;
  if (count == kMaxHidden) return false;
  incref_code(code);
  g_hidden[count] = code;
  g_hidden_count.store(count + 1, std::memory_order_release);
  return true;
}

int walk(Walker walker, RawFrame* out, int max_depth) {
#if ALLOCSCOPE_INTERNAL_WALKER
  if (walker == Walker::kInternal) return without_hidden(out, walk_internal(out, max_depth));
#endif
  if (!can_take_gil()) return 0;
  GilGuard gil;
  return without_hidden(out, walk_public(out, max_depth));
}

bool self_check(std::string* why) {
#if ALLOCSCOPE_INTERNAL_WALKER
  constexpr int kMax = 512;
  static RawFrame internal[kMax];
  static RawFrame reference[kMax];
  int a = walk_internal(internal, kMax);
  int b = walk_public(reference, kMax);
  if (a != b) {
    if (why) *why = "frame count differs: internal " + std::to_string(a) + ", public API " + std::to_string(b);
    return false;
  }
  if (a == 0) {
    if (why) *why = "no Python frames to check against";
    return false;
  }
  for (int i = 0; i < a; ++i) {
    if (internal[i].code != reference[i].code || internal[i].instr != reference[i].instr) {
      if (why) *why = "frame " + std::to_string(i) + " differs from the public API";
      return false;
    }
  }
  return true;
#else
  if (why) *why = "no frame layout compiled for Python " PY_VERSION;
  return false;
#endif
}

Walker choose_walker(std::string* reason) {
  std::string why;
  if (self_check(&why)) {
    if (reason) *reason = "internal";
    return Walker::kInternal;
  }
  if (reason) *reason = "gil (" + why + ")";
  return Walker::kGil;
}

Symbol symbolize(const RawFrame& frame, Walker walker) {
  auto* code = reinterpret_cast<PyCodeObject*>(const_cast<void*>(frame.code));
  Symbol s;
  s.filename = utf8(code->co_filename);
#if PY_VERSION_HEX >= 0x030B0000
  s.function = utf8(code->co_qualname);
  (void)walker;
  s.line = PyCode_Addr2Line(code, frame.instr < 0 ? -1 : frame.instr * 2);
#else
  // Before 3.11 only the GIL walker exists, and it keys frames by line.
  (void)walker;
  s.function = utf8(code->co_name);
  s.line = frame.instr;
#endif
  return s;
}

void incref_code(const void* code) {
  Py_INCREF(reinterpret_cast<PyObject*>(const_cast<void*>(code)));
}

void decref_code(const void* code) {
  Py_DECREF(reinterpret_cast<PyObject*>(const_cast<void*>(code)));
}

bool can_take_gil() {
  return Py_IsInitialized() && !finalizing() && PyGILState_GetThisThreadState() != nullptr;
}

GilGuard::GilGuard() : state_(static_cast<int>(PyGILState_Ensure())) {}
GilGuard::~GilGuard() {
  PyGILState_Release(static_cast<PyGILState_STATE>(state_));
}

GilRelease::GilRelease() : saved_(PyGILState_Check() ? PyEval_SaveThread() : nullptr) {}
GilRelease::~GilRelease() {
  if (saved_ != nullptr) PyEval_RestoreThread(static_cast<PyThreadState*>(saved_));
}

}  // namespace allocscope::pystack

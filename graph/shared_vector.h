// A vector that the copies of its owner share until one of them writes it.
//
// NOTE [Ops shared by forks]
// `Do` returns a fork: a whole `Trace` whose ops are copies of the original's, of which
// only the cone of the edit is re-executed. Copying an op member by member costs a heap
// block per vector and one reference count per tensor it holds, each on a cache line that
// the model's forward pass has since evicted. The members that hold an op's values (`outs`,
// `creation_args`, `arg_sources`) are therefore `SharedVector`s: a copy adds one
// reference to the block the elements live in, and the first write through a copy gives
// that copy its own block.
//
// The reference count lives in the elements' own heap block, so a `SharedVector` costs
// what a `std::vector` costs to build (one allocation, `reserve` then `push_back`), and
// copying one touches one cache line. `parent_params` stays an inlined vector: most ops
// read at most two parameters, and a shared block would add an allocation to every op of
// every capture to save one on a fork.
//
// Reads look like a `const std::vector<T>` (size, iteration, `[]`); writes go through
// `push_back`, `resize`, assignment, `mutable_at` and `mutable_span`. A `SharedVector` is
// as thread-safe as a `const std::vector`: copies may be read on any threads, and a writer
// must be the only user of its own copy.
//
// NOTE [Vectors built in one arena]
// Building a trace gives every op three such vectors, and a block each was three
// allocations and three frees per op: on small-op models, where the allocator's small
// bins are drained and merged by the forward pass around it, that is a visible share of a
// capture. A `SharedVectorArena` holds the blocks of many vectors in one
// allocation, each block laid out as a standalone one would be (count, sizes, elements):
// a vector made there behaves exactly like any other (copies share it, writes past its
// capacity or through a copy move it to a block of its own), and the arena's memory is
// freed when its last block is released. Releasing a block costs an atomic decrement of
// the arena's count instead of a free.
#ifndef TORCHLENS_GRAPH_SHARED_VECTOR_H_
#define TORCHLENS_GRAPH_SHARED_VECTOR_H_

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <iterator>
#include <memory>
#include <new>
#include <utility>
#include <vector>

#include "absl/types/span.h"

namespace torchlens {

namespace shared_vector_internal {

// The head of an arena's allocation: how many of its blocks are alive, plus one for the
// SharedVectorArena itself while it lives.
struct ArenaHead {
  std::atomic<int64_t> refs{1};
  void Unref() {
    if (refs.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      this->~ArenaHead();
      ::operator delete(this);
    }
  }
};

}  // namespace shared_vector_internal

template <typename T>
class SharedVectorArena;

template <typename T>
class SharedVector {
 public:
  using value_type = T;
  using size_type = size_t;
  using const_reference = const T&;
  using reference = const T&;  // reads only: see `mutable_at`
  using const_iterator = const T*;
  using iterator = const T*;

  SharedVector() = default;
  SharedVector(std::initializer_list<T> values) { Assign(values.begin(), values.end()); }
  explicit SharedVector(std::vector<T> values) {
    Assign(std::make_move_iterator(values.begin()), std::make_move_iterator(values.end()));
  }
  SharedVector(const SharedVector& other) : rep_(other.rep_) {
    if (rep_ != nullptr) rep_->refs.fetch_add(1, std::memory_order_relaxed);
  }
  SharedVector(SharedVector&& other) noexcept : rep_(std::exchange(other.rep_, nullptr)) {}
  SharedVector& operator=(const SharedVector& other) {
    SharedVector copy(other);
    std::swap(rep_, copy.rep_);
    return *this;
  }
  SharedVector& operator=(SharedVector&& other) noexcept {
    std::swap(rep_, other.rep_);
    return *this;
  }
  SharedVector& operator=(std::vector<T> values) { return *this = SharedVector(std::move(values)); }
  SharedVector& operator=(std::initializer_list<T> values) { return *this = SharedVector(values); }
  ~SharedVector() { Release(); }

  size_t size() const { return rep_ == nullptr ? 0 : rep_->size; }
  bool empty() const { return size() == 0; }
  const T* data() const { return rep_ == nullptr ? nullptr : rep_->data(); }
  const T* begin() const { return data(); }
  const T* end() const { return data() + size(); }
  const T& operator[](size_t i) const { return rep_->data()[i]; }
  const T& front() const { return rep_->data()[0]; }
  const T& back() const { return rep_->data()[rep_->size - 1]; }
  std::vector<T> ToVector() const { return std::vector<T>(begin(), end()); }
  operator absl::Span<const T>() const { return absl::Span<const T>(data(), size()); }  // NOLINT

  // Writes. Each gives this copy its own block first when another copy shares it.
  T& mutable_at(size_t i) { return MakeOwn()[i]; }
  absl::Span<T> mutable_span() {
    T* own = MakeOwn();
    return absl::Span<T>(own, size());
  }
  void reserve(size_t n) {
    if (n > capacity()) Reallocate(n);
  }
  void push_back(T value) {
    if (size() == capacity() || !Own()) Reallocate(size() == capacity() ? Grown() : capacity());
    new (rep_->data() + rep_->size) T(std::move(value));
    ++rep_->size;
  }
  void resize(size_t n) {
    if (n < size()) {
      T* own = MakeOwn();
      std::destroy(own + n, own + rep_->size);
      rep_->size = n;
      return;
    }
    reserve(n);
    MakeOwn();
    for (size_t i = size(); i < n; ++i) new (rep_->data() + i) T();
    if (rep_ != nullptr) rep_->size = n;
  }
  void clear() {
    Release();
    rep_ = nullptr;
  }

  friend bool operator==(const SharedVector& a, const SharedVector& b) {
    return a.rep_ == b.rep_ || std::equal(a.begin(), a.end(), b.begin(), b.end());
  }

 private:
  friend class SharedVectorArena<T>;

  // NOTE [Ops shared by forks]: the count and sizes, then the elements, in one block.
  struct alignas(alignof(T) > alignof(size_t) ? alignof(T) : alignof(size_t)) Rep {
    std::atomic<int32_t> refs{1};
    size_t size = 0;
    size_t capacity = 0;
    // The arena the block lives in (NOTE [Vectors built in one arena]); null for a block
    // of its own.
    shared_vector_internal::ArenaHead* arena = nullptr;
    T* data() { return reinterpret_cast<T*>(this + 1); }
  };

  explicit SharedVector(Rep* rep) : rep_(rep) {}

  size_t capacity() const { return rep_ == nullptr ? 0 : rep_->capacity; }
  bool Own() const { return rep_ != nullptr && rep_->refs.load(std::memory_order_acquire) == 1; }
  size_t Grown() const { return std::max<size_t>(4, 2 * capacity()); }

  T* MakeOwn() {
    if (rep_ == nullptr) return nullptr;
    if (!Own()) Reallocate(capacity());
    return rep_->data();
  }

  // A block of `capacity` (at least the size) holding this copy's elements: moved when the
  // old block was this copy's alone, copied when it is shared.
  void Reallocate(size_t capacity) {
    capacity = std::max(capacity, size());
    if (capacity == 0) return;
    Rep* rep = new (::operator new(sizeof(Rep) + capacity * sizeof(T))) Rep();
    rep->capacity = capacity;
    if (rep_ != nullptr) {
      if (Own()) {
        std::uninitialized_move(rep_->data(), rep_->data() + rep_->size, rep->data());
      } else {
        std::uninitialized_copy(rep_->data(), rep_->data() + rep_->size, rep->data());
      }
      rep->size = rep_->size;
    }
    Release();
    rep_ = rep;
  }

  template <typename It>
  void Assign(It first, It last) {
    const size_t n = static_cast<size_t>(std::distance(first, last));
    if (n == 0) return;
    Reallocate(n);
    std::uninitialized_copy(first, last, rep_->data());
    rep_->size = n;
  }

  // The sole owner frees the block without an atomic write: no other copy exists that
  // could take a new reference meanwhile. A trace's own ops are the sole owners of their
  // blocks unless the trace was forked, so destroying a trace costs what it did with
  // `std::vector`s.
  void Release() {
    if (rep_ == nullptr) return;
    if (rep_->refs.load(std::memory_order_acquire) != 1 &&
        rep_->refs.fetch_sub(1, std::memory_order_acq_rel) != 1) {
      return;
    }
    std::destroy(rep_->data(), rep_->data() + rep_->size);
    shared_vector_internal::ArenaHead* arena = rep_->arena;
    rep_->~Rep();
    if (arena != nullptr) {
      arena->Unref();
    } else {
      ::operator delete(rep_);
    }
  }

  Rep* rep_ = nullptr;
};

// Makes SharedVectors whose blocks share one allocation (NOTE [Vectors built in one
// arena]). Not thread-safe itself; the vectors it makes are as any other.
template <typename T>
class SharedVectorArena {
 public:
  // Room for `vectors` vectors of `elements` elements in all; vectors made beyond that
  // get blocks of their own.
  SharedVectorArena(size_t vectors, size_t elements) {
    static_assert(alignof(Rep) <= __STDCPP_DEFAULT_NEW_ALIGNMENT__,
                  "the arena's blocks are aligned as operator new aligns");
    const size_t bytes =
        HeadBytes() + vectors * (sizeof(Rep) + alignof(Rep)) + elements * sizeof(T);
    head_ = new (::operator new(bytes)) shared_vector_internal::ArenaHead();
    next_ = reinterpret_cast<char*>(head_) + HeadBytes();
    end_ = reinterpret_cast<char*>(head_) + bytes;
  }
  SharedVectorArena(const SharedVectorArena&) = delete;
  SharedVectorArena& operator=(const SharedVectorArena&) = delete;
  ~SharedVectorArena() { head_->Unref(); }

  // An empty vector with room for `capacity` elements.
  SharedVector<T> Make(size_t capacity) {
    SharedVector<T> vector;
    if (capacity == 0) return vector;
    const size_t bytes = RoundUp(sizeof(Rep) + capacity * sizeof(T));
    if (static_cast<size_t>(end_ - next_) < bytes) {
      vector.reserve(capacity);
      return vector;
    }
    Rep* rep = new (next_) Rep();
    next_ += bytes;
    rep->capacity = capacity;
    rep->arena = head_;
    head_->refs.fetch_add(1, std::memory_order_relaxed);
    return SharedVector<T>(rep);
  }

 private:
  using Rep = typename SharedVector<T>::Rep;
  static size_t RoundUp(size_t bytes) {
    return (bytes + alignof(Rep) - 1) / alignof(Rep) * alignof(Rep);
  }
  static size_t HeadBytes() { return RoundUp(sizeof(shared_vector_internal::ArenaHead)); }

  shared_vector_internal::ArenaHead* head_;
  char* next_;
  char* end_;
};

}  // namespace torchlens

#endif  // TORCHLENS_GRAPH_SHARED_VECTOR_H_

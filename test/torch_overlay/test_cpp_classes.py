"""Finding classes and the data members that a series adds to them."""

import pytest

from torch_overlay import cpp_classes

HEADER = """#pragma once
#include <atomic>
// A comment with { a brace and a "class Fake {" in it.
namespace c10d {
class TORCH_API Reducer {
 public:
  explicit Reducer(std::vector<at::Tensor> params = {}, bool x = false);
  void update_process_group(
      c10::intrusive_ptr<c10d::ProcessGroup> new_process_group);
  bool ready() const {
    return ready_;
  }
  struct Bucket {
    at::Tensor gradients;
  };

 protected:
  mutable std::mutex mutex_;
  const c10::intrusive_ptr<c10d::ProcessGroup> process_group_;
  std::vector<Bucket> buckets_;
  bool ready_{false};
  static constexpr int kCount = 3;
  using Map = std::unordered_map<size_t, size_t>;
};
} // namespace c10d
"""


def test_classes_members_and_bases_are_found():
    classes, members = cpp_classes.scan(
        HEADER
        + "namespace c10d::nccl2 {\nclass TORCH_API Group : public ::c10d::Backend {\n  int n_;\n};\n}\n"
    )
    assert {c.qualified: c.bases for c in classes} == {
        "c10d::Reducer::Bucket": (),
        "c10d::Reducer": (),
        "c10d::nccl2::Group": ("::c10d::Backend",),
    }
    assert [(m.owner, m.name, m.nested) for m in members] == [
        ("c10d::Reducer::Bucket", "gradients", True),
        ("c10d::Reducer", "mutex_", False),
        ("c10d::Reducer", "process_group_", False),
        ("c10d::Reducer", "buckets_", False),
        ("c10d::Reducer", "ready_", False),
        ("c10d::nccl2::Group", "n_", False),
    ]


def test_an_added_member_is_found_and_left_out_of_the_installed_header():
    patched = HEADER.replace(
        "  bool ready_{false};\n",
        "  bool ready_{false};\n  // Where the last pass failed.\n  std::optional<size_t> failed_at_;\n",
    ).replace(
        "  void update_process_group(",
        "  // Describes the reducer.\n  at::Tensor describe() const;\n  void update_process_group(",
    )
    [added] = cpp_classes.find_added_members("reducer.hpp", HEADER, patched)
    assert (added.member.owner, added.member.name, added.member.text) == (
        "c10d::Reducer",
        "failed_at_",
        "std::optional<size_t> failed_at_;",
    )
    installed = cpp_classes.strip_members(patched, [added])
    assert "failed_at_" not in installed
    # The member function it adds stays, and the comment above the member.
    assert "at::Tensor describe() const;" in installed
    assert "// Where the last pass failed." in installed


def test_dropping_a_const_changes_no_layout():
    patched = HEADER.replace(
        "  const c10::intrusive_ptr<c10d::ProcessGroup> process_group_;",
        "  c10::intrusive_ptr<c10d::ProcessGroup> process_group_;",
    )
    assert cpp_classes.find_added_members("reducer.hpp", HEADER, patched) == []


@pytest.mark.parametrize(
    "old, new, message",
    [
        (
            "  bool ready_{false};\n",
            "  int ready_{0};\n",
            "changes or removes the data member c10d::Reducer::ready_",
        ),
        (
            "  bool ready_{false};\n",
            "",
            "changes or removes the data member c10d::Reducer::ready_",
        ),
        (
            "    at::Tensor gradients;\n",
            "    at::Tensor gradients;\n    bool moved = false;\n",
            "adds the data member moved to c10d::Reducer::Bucket, a class nested in another",
        ),
        (
            "    return ready_;\n",
            "    return ready_ && !failed_;\n",
            "uses c10d::Reducer::failed_, a data member that the series adds, in the header",
        ),
    ],
    ids=["changed", "removed", "nested class", "used inline"],
)
def test_what_a_shim_cannot_carry_is_refused(old, new, message):
    patched = HEADER.replace(old, new)
    if "failed_" in new:
        patched = patched.replace(
            "  bool ready_{false};\n", "  bool ready_{false};\n  bool failed_{false};\n"
        )
    with pytest.raises(cpp_classes.ClassesError, match=message):
        cpp_classes.find_added_members("reducer.hpp", HEADER, patched)

"""CPU executables compiled in groups (targets/executable_groups.py): the grouped module
runs as the linked one does, and a module the grouping does not recognize is compiled
linked instead of failing."""

import os
import re
import subprocess
import sys

import pytest
import torch

import tori
from tori.targets import Target, executable_groups
from tori.targets.build import GROUPED_INPUT_MIN, executable_groups as groups_for
from tori.targets.executable_groups import GroupingError, group_executables
from tori.targets.inspect import inspect_vmfb
from tori.targets.iree_compile import IreeInvocation, run_iree_compile
from tori.testing import assert_matches_eager

# What iree-compile's configuration phase prints, cut to the parts the grouping reads:
# three executables (one of them with two exports) and a host function dispatching each.
CONFIGURED = """\
#target = #hal.executable.target<"llvm-cpu", "embedded-elf-x86_64", {}>
module {
  hal.executable private @ex_a {
    hal.executable.variant public @embedded_elf_x86_64 target(#target) {
      hal.executable.export public @a0 ordinal(0) layout(#layout) count(%arg0: !hal.device) -> (index, index, index) {
        hal.return %c1, %c1, %c1 : index, index, index
      } loc("a")
      hal.executable.export public @a1 ordinal(1) layout(#layout) count(%arg0: !hal.device) -> (index, index, index) {
        hal.return %c1, %c1, %c1 : index, index, index
      }
      builtin.module {
        func.func @a0() {
          return
        }
        func.func @a1() {
          return
        }
      }
    }
  } loc("a")
  hal.executable private @"ex$b" {
    hal.executable.variant public @embedded_elf_x86_64 target(#target) {
      hal.executable.export public @b0 ordinal(0) layout(#layout) count(%arg0: !hal.device) -> (index, index, index) {
        hal.return %c1, %c1, %c1 : index, index, index
      }
      builtin.module {
        func.func @b0() {
          return
        }
      }
    }
  }
  hal.executable private @ex_c {
    hal.executable.variant public @embedded_elf_x86_64 target(#target) {
      hal.executable.export public @c0 ordinal(0) layout(#layout) count(%arg0: !hal.device) -> (index, index, index) {
        hal.return %c1, %c1, %c1 : index, index, index
      }
      builtin.module {
        func.func @c0() {
          return
        }
      }
    }
  }
  util.func public @main() {
    stream.cmd.dispatch {@ex_a::@embedded_elf_x86_64::@a0, @ex_a::@embedded_elf_x86_64::@a1}
    stream.cmd.dispatch @"ex$b"::@embedded_elf_x86_64::@b0
    stream.cmd.dispatch @ex_c::@embedded_elf_x86_64::@c0
    util.return
  }
}
"""


def test_executables_merge_round_robin_with_ordinals_and_references_renamed():
    grouped = group_executables(CONFIGURED, 2)
    assert re.findall(r"^  hal\.executable private @(\S+) \{$", grouped, re.M) == ["ex_a", '"ex$b"']
    first, second = grouped.split('hal.executable private @"ex$b"')
    # ex_a and ex_c in the first group, their exports numbered on; ex$b alone in the second.
    assert re.findall(r"export public @(\w+) ordinal\((\d)\)", first) == [("a0", "0"), ("a1", "1"), ("c0", "2")]
    assert "func.func @a1()" in first and "func.func @c0()" in first and "func.func @b0()" in second
    assert "stream.cmd.dispatch @ex_a::@embedded_elf_x86_64::@c0" in grouped
    assert 'stream.cmd.dispatch @"ex$b"::@embedded_elf_x86_64::@b0' in grouped
    assert "@ex_c" not in grouped
    # One group per executable or more: the module as it was.
    assert group_executables(CONFIGURED, 3) == CONFIGURED and group_executables(CONFIGURED, 1) == CONFIGURED


@pytest.mark.parametrize("change, message", [
    (lambda t: t.replace("        func.func @c0() {", "        func.func @a1() {", 1), "symbol @a1 is defined in more"),
    (lambda t: t.replace("      builtin.module {\n        func.func @c0", "      }\n    }\n"
                         "    hal.executable.variant public @vmvx target(#target) {\n      builtin.module {\n"
                         "        func.func @c0", 1), "executable @ex_c has 2 variants"),
    (lambda t: t.replace("target(#target) {\n      hal.executable.export public @b0",
                         "target(#target) objects([#hal.executable.object<{path = \"k.o\"}>]) {\n"
                         "      hal.executable.export public @b0", 1), "its variant links objects"),
    (lambda t: t.replace('@"ex$b" {\n    hal.executable.variant public @embedded_elf_x86_64 target(#target)',
                         '@"ex$b" {\n    hal.executable.variant public @embedded_elf_x86_64 target(#other)', 1),
     "variants for different targets"),
])
def test_a_module_the_grouping_does_not_recognize_is_an_error_naming_what(change, message):
    changed = change(CONFIGURED)
    assert changed != CONFIGURED
    with pytest.raises(GroupingError, match=re.escape(message)):
        group_executables(changed, 2)
    done = subprocess.run([sys.executable, executable_groups.__file__, "2"], input=changed, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 1 and done.stdout == "" and "error: executable groups: " in done.stderr


class _Net(torch.nn.Module):
    # Large enough to be grouped (build.GROUPED_INPUT_MIN).
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 8, 3, padding=1, groups=2)
        self.head = torch.nn.Linear(8, 5)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        z = torch.nn.functional.gelu(self.conv2(y)) + y
        return torch.softmax(self.head(z.mean((2, 3))), -1), z.amax(1), z.flip(2) * y.sum(3, keepdim=True)


def test_cpu_executables_compile_in_one_group_per_core_and_match_eager():
    model, x = _Net().eval(), torch.randn(2, 3, 12, 12)
    with torch.no_grad():
        assert_matches_eager(model, x, options={"cache": False})
    graph = tori.compile_records()[-1].graphs[0]
    used: IreeInvocation = graph.iree_invocation
    cores = min(len(os.sched_getaffinity(0)), 8)
    assert used.groups == cores and groups_for(Target.CPU, graph.iree_bytecode) == cores
    assert groups_for(Target.VULKAN, graph.iree_bytecode) == 1
    assert len(graph.iree_bytecode) >= GROUPED_INPUT_MIN
    assert groups_for(Target.CPU, bytes(17 << 20)) == 1  # a module holding its weights: linked
    assert groups_for(Target.CPU, bytes(1 << 10)) == 1  # a few ops: linked
    command = used.shell_command("in.mlirbc")
    assert ("--iree-hal-link-executables=false" in command) == (cores > 1)
    executables = inspect_vmfb(graph.compiled._vmfb).executables
    assert len(executables) == (cores if cores > 1 else 1), executables
    # The same module linked as IREE links it (the user's own linking flag) runs alike.
    linked = IreeInvocation((*used.flags, "--iree-hal-link-executables=true"), groups=used.groups)
    assert not linked.grouped and "executable_groups" not in linked.shell_command("in.mlirbc")
    assert len(inspect_vmfb(run_iree_compile(graph.iree_bytecode, linked, graph="linked", timeout_s=300))
               .executables) == 1


def test_a_module_with_two_variants_per_executable_compiles_linked(caplog):
    # IREE's VMVX backend beside llvm-cpu: every executable has two variants, which the
    # grouping refuses; the graph still compiles, linked, with a note in the log.
    model = torch.nn.Sequential(*(m for _ in range(14) for m in (torch.nn.Linear(16, 16), torch.nn.Tanh()))).eval()
    x = torch.randn(4, 16)
    options = {"cache": False, "iree_flags": ["--iree-hal-local-target-device-backends=vmvx"]}
    with caplog.at_level("INFO", logger="tori.compile"), torch.no_grad():
        assert_matches_eager(model, x, options=options)
    graph = tori.compile_records()[-1].graphs[0]
    used = graph.iree_invocation
    assert len(graph.iree_bytecode) >= GROUPED_INPUT_MIN
    if min(len(os.sched_getaffinity(0)), 8) > 1:
        assert not used.grouped
        assert any("executable groups:" in r.getMessage() and "compiled linked" in r.getMessage()
                   for r in caplog.records)


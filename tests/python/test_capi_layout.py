"""The C ABI's structs as strata._capi mirrors them with ctypes (issue 34: six structs of strata.h copied by
hand, nothing checking their layout). For each one, a C compiler reads strata.h and prints every field's
offset and size and the struct's size; the ctypes fields must be the C fields in their order (a prefix, as a
caller built before a field was appended would be) at the same offsets and sizes. A field added to strata.h
without the ctypes side, reordered, or retyped to another width fails here instead of corrupting memory."""
import ctypes
import os
import re
import shutil
import subprocess

import pytest

from strata import _capi

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
HEADER = os.path.join(ROOT, "runtime", "capi", "strata.h")
MIRRORS = {"strata_engine_options": _capi.EngineOptions, "strata_param_spec": _capi.ParamSpec,
           "strata_param_info": _capi.ParamInfo, "strata_unit_buffers": _capi.UnitBuffers,
           "strata_step_result": _capi.StepResult, "strata_stats": _capi.Stats,
           "strata_foreign_comm": _capi.ForeignComm}


def c_fields(text, name):
    """The field names of `typedef struct name { ... } name;`, in order (comments removed first); a function
    pointer's is the name in `(*name)(...)`."""
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    body = re.search(r"typedef struct %s \{(.*?)\} %s;" % (name, name), text, re.S)
    assert body, f"{name} is not a typedef'd struct in strata.h"
    return [(re.search(r"\(\*(\w+)\)", stmt) or re.search(r"(\w+)\s*$", stmt.strip())).group(1)
            for stmt in body.group(1).split(";") if stmt.strip()]


def c_layout(tmp_path, header):
    """{struct: (sizeof, [(field, offset, size)])} as the C compiler lays out `header`'s structs."""
    text = open(header).read()
    lines = ["#include <stddef.h>", "#include <stdio.h>", '#include "strata.h"', "int main(void) {"]
    for name in MIRRORS:
        lines.append(f'  printf("struct {name} %zu\\n", sizeof({name}));')
        for f in c_fields(text, name):
            lines.append(f'  printf("field {name} {f} %zu %zu\\n", offsetof({name}, {f}), '
                         f'sizeof((({name}*)0)->{f}));')
    lines += ["  return 0;", "}"]
    src, exe = tmp_path / "layout.c", tmp_path / "layout"
    src.write_text("\n".join(lines) + "\n")
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.fail("no C compiler on PATH: the layout check needs one (the build has one)")
    subprocess.run([cc, "-std=c99", "-I", os.path.dirname(header), str(src), "-o", str(exe)], check=True)
    out = {}
    for line in subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.splitlines():
        kind, name, *rest = line.split()
        if kind == "struct":
            out[name] = (int(rest[0]), [])
        else:
            out[name][1].append((rest[0], int(rest[1]), int(rest[2])))
    return out


def ctypes_layout(mirror):
    return [(f, getattr(mirror, f).offset, getattr(mirror, f).size) for f, _ in mirror._fields_]


def test_ctypes_mirrors_match_strata_h(tmp_path):
    layout = c_layout(tmp_path, HEADER)
    for name, mirror in MIRRORS.items():
        size, fields = layout[name]
        mine = ctypes_layout(mirror)
        assert mine == fields[:len(mine)], f"{mirror.__name__} differs from {name}: {mine} vs {fields}"
        if len(mine) == len(fields):
            assert ctypes.sizeof(mirror) == size, f"{mirror.__name__}: sizeof {ctypes.sizeof(mirror)} vs {size}"


def test_a_field_out_of_step_is_found(tmp_path):
    """The check itself: a header with a field the mirror lacks in the middle, or of another width, fails."""
    text = open(HEADER).read().replace("  int32_t ndim;         /* 1 .. 64 */",
                                       "  int64_t ndim;         /* 1 .. 64 */", 1)
    assert "int64_t ndim;" in text
    (tmp_path / "strata.h").write_text(text)
    size, fields = c_layout(tmp_path, str(tmp_path / "strata.h"))["strata_param_spec"]
    assert ctypes_layout(_capi.ParamSpec) != fields[:len(_capi.ParamSpec._fields_)]

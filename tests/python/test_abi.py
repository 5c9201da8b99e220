"""hora/_lib.py copies result codes, dtypes, ops, compressions, HORA_MAX_DIMS,
struct layouts and prototypes from include/*.h by hand. These tests compile
a small C program against hora.h to print what the compiler sees and compare
it with the ctypes layer, both ways: a header entry _lib.py lacks fails as
much as a value that differs."""
import ctypes
import os
import re
import shutil
import subprocess
import tempfile

import pytest

from hora import _lib as L

INCLUDE = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                        "..", "..", "include"))
HEADERS = ["hora.h", "hora_mpi.h", "hora_cuda.h"]

# The hora.h enums _lib.py mirrors (hora_result comes from HORA_RESULT_MAP);
# a Python name is the C name without "HORA_".
ENUMS = ["hora_dtype", "hora_op", "hora_compression"]
# ctypes Structure in _lib.py -> the C struct it mirrors.
STRUCTS = {"AllreduceOptions": "hora_allreduce_options", "OpOptions": "hora_op_options",
           "Received": "hora_received", "Stats": "hora_stats", "StepStats": "hora_step_stats"}


def need(cond, msg):
    """assert, with the message shown by the harness (it runs without -v)."""
    if not cond:
        pytest.fail(msg, pytrace=False)


def _text(name):
    with open(os.path.join(INCLUDE, name)) as f:
        s = f.read()
    s = re.sub(r"/\*.*?\*/", " ", s, flags=re.S)
    return re.sub(r"//[^\n]*", " ", s)


def _enum_members(text, tag):
    m = re.search(r"typedef\s+enum\s+%s\s*\{(.*?)\}\s*%s\s*;" % (tag, tag), text, re.S)
    need(m, "include/hora.h has no `typedef enum %s`" % tag)
    names = [e.split("=")[0].strip() for e in m.group(1).split(",")]
    return [n for n in names if n]


def _struct_fields(text, tag):
    """[(field, kind)], kind "ptr", "float" or "int", in declaration order."""
    m = re.search(r"typedef\s+struct\s+%s\s*\{(.*?)\}\s*%s\s*;" % (tag, tag), text, re.S)
    need(m, "include/hora.h has no `typedef struct %s`" % tag)
    out = []
    for decl in m.group(1).split(";"):
        decl = " ".join(decl.split())
        if not decl:
            continue
        base = re.match(r"^((?:const\s+|struct\s+|unsigned\s+)*\w+)", decl).group(1)
        for d in decl[len(base):].split(","):
            name = re.search(r"(\w+)\s*(\[[^\]]*\])?\s*$", d).group(1)
            kind = "ptr" if "*" in d else ("float" if base in ("double", "float") else "int")
            out.append((name, kind))
    return out


def _result_names(text):
    m = re.search(r"#define\s+HORA_RESULT_MAP\(X\)(.*?)\n\s*\n", text, re.S)
    need(m, "include/hora.h has no HORA_RESULT_MAP")
    return re.findall(r"X\(\s*(\w+)\s*,", m.group(1))


@pytest.fixture(scope="module")
def header():
    """What the compiler makes of hora.h: {("enum"|"define", name): value,
    ("sizeof", struct): n, ("field", struct, field): (offset, size)}."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc or not shutil.which(cc.split()[0]):
        pytest.skip("no C compiler (cc, gcc or clang; or $CC) to compile include/hora.h with")
    text = _text("hora.h")
    lines = ['#include <stdio.h>', '#include <stddef.h>', '#include "hora.h"',
             "int main(void) {",
             '#define P_(name, text) printf("enum %s %d\\n", #name, (int)HORA_##name);',
             "  HORA_RESULT_MAP(P_)",
             '  printf("define MAX_DIMS %d\\n", (int)HORA_MAX_DIMS);']
    for tag in ENUMS:
        for n in _enum_members(text, tag):
            lines.append('  printf("enum %s %%d\\n", (int)%s);' % (n[len("HORA_"):], n))
    for tag in STRUCTS.values():
        lines.append('  printf("sizeof %s %%zu\\n", sizeof(%s));' % (tag, tag))
        for f, _ in _struct_fields(text, tag):
            lines.append('  printf("field %s %s %%zu %%zu\\n", offsetof(%s, %s), '
                         'sizeof(((%s *)0)->%s));' % (tag, f, tag, f, tag, f))
    lines += ["  return 0;", "}"]
    d = tempfile.mkdtemp(prefix="hora-abi-")
    try:
        src, exe = os.path.join(d, "abi.c"), os.path.join(d, "abi")
        with open(src, "w") as f:
            f.write("\n".join(lines) + "\n")
        p = subprocess.run(cc.split() + ["-std=c99", "-I", INCLUDE, src, "-o", exe],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           universal_newlines=True)
        need(p.returncode == 0, "compiling against hora.h failed:\n" + p.stdout[-2000:])
        out = subprocess.run([exe], stdout=subprocess.PIPE, check=True,
                             universal_newlines=True).stdout
    finally:
        shutil.rmtree(d, ignore_errors=True)
    got = {}
    for line in out.splitlines():
        w = line.split()
        if w[0] in ("enum", "define"):
            got[(w[0], w[1])] = int(w[2])
        elif w[0] == "sizeof":
            got[("sizeof", w[1])] = int(w[2])
        else:
            got[("field", w[1], w[2])] = (int(w[3]), int(w[4]))
    return got


def _py_constants():
    """_lib.py's ABI constants: its module-level upper-case ints."""
    return {k: v for k, v in vars(L).items()
            if k.isupper() and isinstance(v, int) and not isinstance(v, bool)}


def test_every_header_constant_has_the_same_value_in_lib(header):
    py = _py_constants()
    bad = []
    consts = sorted((k[1], v) for k, v in header.items() if k[0] in ("enum", "define"))
    for name, v in consts:
        if name not in py:
            bad.append("HORA_%s = %d is missing from _lib.py" % (name, v))
        elif py[name] != v:
            bad.append("%s is %d in _lib.py, HORA_%s = %d in hora.h" % (name, py[name], name, v))
    need(not bad, "; ".join(bad))


def test_every_lib_constant_is_in_the_header(header):
    known = {k[1] for k in header if k[0] in ("enum", "define")}
    extra = sorted(k for k in _py_constants() if k not in known)
    need(not extra, "_lib.py has constants hora.h does not define: %s" % ", ".join(extra))


def test_result_codes_follow_the_result_map(header):
    names = _result_names(_text("hora.h"))
    need(names, "HORA_RESULT_MAP lists no codes")
    want = list(range(len(names)))
    got = [getattr(L, n, None) for n in names]
    need(got == want, "_lib.py's codes %s, HORA_RESULT_MAP's order %s" % (
        list(zip(names, got)), list(zip(names, want))))


def test_every_ctypes_structure_is_checked():
    mirrored = sorted(k for k, v in vars(L).items()
                      if isinstance(v, type) and issubclass(v, ctypes.Structure))
    need(mirrored == sorted(STRUCTS), (
        "_lib.py's Structures %s; this test maps %s: add the new one to STRUCTS"
        % (mirrored, sorted(STRUCTS))))


@pytest.mark.parametrize("py_name", sorted(STRUCTS))
def test_struct_layout_matches_the_header(header, py_name):
    tag = STRUCTS[py_name]
    cls = getattr(L, py_name)
    c_fields = _struct_fields(_text("hora.h"), tag)
    py_fields = [f[0] for f in cls._fields_]
    need(py_fields == [f for f, _ in c_fields], (
        "%s's fields %s, %s's %s" % (py_name, py_fields, tag, [f for f, _ in c_fields])))
    bad = []
    for (f, kind), (_, t) in zip(c_fields, cls._fields_):
        off, size = header[("field", tag, f)]
        desc = getattr(cls, f)
        if (desc.offset, desc.size) != (off, size):
            bad.append("%s.%s at offset %d size %d, C: offset %d size %d"
                       % (py_name, f, desc.offset, desc.size, off, size))
        got = {"size": "int", "i64": "int"}.get(_py_kind(t), _py_kind(t))
        if got != kind:
            bad.append("%s.%s is a %s in _lib.py, a %s in C" % (py_name, f, got, kind))
    if ctypes.sizeof(cls) != header[("sizeof", tag)]:
        bad.append("sizeof %s %d, sizeof(%s) %d"
                   % (py_name, ctypes.sizeof(cls), tag, header[("sizeof", tag)]))
    need(not bad, "; ".join(bad))


class _Recorder:
    """Stands in for the CDLL: records what Library declares, optional calls too."""

    def __init__(self):
        self.declared = {}

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return self.declared.setdefault(name, _Fn())


class _Fn:
    restype = argtypes = None


def _prototypes():
    """{name: (return kind, [parameter kinds])} from every public header."""
    out = {}
    for h in HEADERS:
        for ret, name, params in re.findall(
                r"HORA_EXTERN\s+([\w\s\*]+?)\s*\b(hora_\w+)\s*\(([^)]*)\)\s*;", _text(h)):
            ps = [" ".join(p.split()) for p in params.split(",")]
            if ps == ["void"]:
                ps = []
            out[name] = (_c_kind(ret + " x"), [_c_kind(p) for p in ps])
    return out


def _c_kind(decl):
    """The ABI class of a C declaration: ptr, size, int, float, i64, void or
    opaque (MPI_Comm, which _lib.py passes as given)."""
    if "*" in decl:
        return "ptr"
    words = [w for w in decl.split() if w not in ("const", "enum", "unsigned")]
    base = words[0]
    if base in ("cudaStream_t",):
        return "ptr"
    if base == "MPI_Comm":
        return "opaque"
    return {"size_t": "size", "double": "float", "int64_t": "i64", "void": "void"}.get(base, "int")


def _py_kind(t):
    if t is None:
        return "void"
    if t in (ctypes.c_void_p, ctypes.c_char_p) or issubclass(t, ctypes._Pointer):
        return "ptr"
    if t is ctypes.c_size_t:
        return "size"
    if t is ctypes.c_int:
        return "int"
    if t in (ctypes.c_int64, ctypes.c_uint64):
        return "i64"
    if t in (ctypes.c_double, ctypes.c_float):
        return "float"
    return repr(t)


def test_every_declared_call_matches_its_prototype():
    rec = _Recorder()
    L.Library(rec, "(recorded)")
    protos = _prototypes()
    need("hora_wait" in protos, "the prototype parser found no hora_wait in %s" % HEADERS)
    need(rec.declared, "Library declared no calls")
    bad = []
    for name, fn in sorted(rec.declared.items()):
        if name not in protos:
            bad.append("%s is not declared in %s" % (name, ", ".join(HEADERS)))
            continue
        ret, params = protos[name]
        if _py_kind(fn.restype) != ret:
            bad.append("%s returns %s in _lib.py, %s in C" % (name, _py_kind(fn.restype), ret))
        if fn.argtypes is None:  # passed as the caller builds them (MPI_Comm)
            continue
        got = [_py_kind(t) for t in fn.argtypes]
        if len(got) != len(params):
            bad.append("%s takes %d parameters in _lib.py, %d in C"
                       % (name, len(got), len(params)))
        elif got != params:
            bad.append("%s's parameters are %s in _lib.py, %s in C" % (name, got, params))
    need(not bad, "; ".join(bad))

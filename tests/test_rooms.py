#!/usr/bin/env python3
"""tests/test_rooms.py — the shape of the source tree: one straight include line, no circle.

The trainer is one compilation: train.c includes the rooms in one line (each below the
next). Here, from the sources themselves:
  - the line is the order of train.c's own #include lines (device.cuh, blas_cores.h and the
    kernel families of kernels/ come in through kernels.cuh, their index, in its order;
    tokenizer.h (with its generated tokenizer_unicode.h) and data.c stand alone below
    everything, preprocess.c sits on both);
  - no room uses a name (function, CUDA's __device__ and __global__ ones too, macro, type,
    file-level variable) that a room above it defines: calls and types go down the line
    only, so there is no circle (a room above hands a room below what it needs as a
    function pointer, as data_parallel.h does the model's hooks and parallel.h kernels.cuh's fail);
  - no room declares a function ahead (a prototype without its body);
  - every room is at most 1,500 lines, and each kernel family of kernels/ at most 900.
Prints one PASS/FAIL line per check.
"""
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
LONGEST = 1500
LONGEST_FAMILY = 900   # a file of kernels/
failed = 0


def report(ok, name, why=""):
    global failed
    print(("PASS " if ok else "FAIL ") + name + ("" if ok else ": " + why))
    failed += not ok


def read(name):
    with open(os.path.join(ROOT, name)) as f:
        return f.read()


def code_only(text):
    """the text without comments, strings and character literals (each kept as a space)"""
    pattern = r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\''
    return re.sub(pattern, " ", text, flags=re.S)


KEYWORDS = {"void", "int", "char", "float", "double", "long", "unsigned", "const", "static", "inline", "struct",
            "size_t", "uint8_t", "uint32_t", "uint64_t", "int32_t", "int64_t"}


def defined_names(code):
    """the file-level names a room defines: functions, macros, types, static variables"""
    names = set(re.findall(r"^#define\s+(\w+)", code, flags=re.M))
    names |= set(re.findall(r"^static\s+(?:inline\s+)?(?:const\s+)?[\w\s\*]*?\b(\w+)\s*\(", code, flags=re.M))
    names |= set(re.findall(r"^}\s*(\w+)\s*;", code, flags=re.M))                        # typedef struct {...} Name;
    names |= set(re.findall(r"^typedef\s[^;{]*?\b(\w+)\s*;", code, flags=re.M))            # typedef T Name;
    names |= set(re.findall(r"^typedef\s+enum\s*{[^}]*}\s*(\w+)\s*;", code, flags=re.M))
    names |= set(re.findall(r"^static\s+(?:const\s+)?[\w\s\*]*?\b(\w+)\s*(?:\[[^\]]*\])*\s*(?:=|;)", code, flags=re.M))
    names |= set(re.findall(r"^static\s+[\w\s\*]*\(\s*\*\s*(\w+)\s*\)", code, flags=re.M))   # function pointers
    names |= set(re.findall(r"^(?:template\s*<[^>]*>\s*)?(?:(?:__global__|__device__|__host__|HOST_DEVICE|static|inline)\s+)+"
                            r"[\w\s\*]*?(?:__launch_bounds__\s*\([^)]*\)\s*)?\b(\w+)\s*\(", code, flags=re.M))   # CUDA functions
    return names - KEYWORDS


def include_line():
    """train.c's includes, in order, with device.cuh, blas_cores.h and kernels/ where kernels.cuh includes them"""
    line = []
    for name in re.findall(r'^#include "([\w.]+)"', read("train.c"), flags=re.M):
        if name == "kernels.cuh":
            line += [n for n in re.findall(r'^#include "([\w./]+)"', read(name), flags=re.M) if n not in line]
        line.append(name)
    return line + ["train.c"]


rooms = include_line()
report(rooms[:3] == ["files.h", "tokenizer.h", "data.c"] and len(rooms) == len(set(rooms)),
       "train.c includes the rooms in one line, files.h, tokenizer.h and data.c first: " + " -> ".join(rooms), " -> ".join(rooms))
for room in rooms[:-1]:
    others = re.findall(r'^#include "([\w./]+)"', read(room), flags=re.M)
    allowed = ({"device.cuh", "blas_cores.h"} | {n for n in rooms if n.startswith("kernels/")} if room == "kernels.cuh"
               else {"tokenizer_unicode.h"} if room == "tokenizer.h" else set())
    report(set(others) <= allowed, room + " includes no other room", ", ".join(others))

code = {room: code_only(read(room)) for room in rooms}
defines = {room: defined_names(code[room]) for room in rooms}
for i, room in enumerate(rooms):
    above = {}
    for upper in rooms[i + 1:]:
        for name in defines[upper] - defines[room]:
            above.setdefault(name, upper)
    used = sorted(n for n in set(re.findall(r"\b\w+\b", code[room])) if n in above)
    report(not used, room + " uses nothing defined above it in the line",
           ", ".join("%s (%s)" % (n, above[n]) for n in used[:8]))

for room in rooms:   # a prototype of a function the room does not define (one of its own, for an attribute, is fine)
    protos = re.findall(r"^static\s[^=;{}()]*\b(\w+)\s*\([^;{}]*\)[^;{}]*;", code[room], flags=re.M)
    bodies = set(re.findall(r"^static\s[^=;{}()]*\b(\w+)\s*\([^;{}]*\)\s*{", code[room], flags=re.M))
    ahead = [n for n in protos if n not in bodies and n not in KEYWORDS]
    report(not ahead, room + " declares no function ahead", ", ".join(ahead))

pre = code_only(read("preprocess.c"))
report(re.findall(r'^#include "([\w.]+)"', read("preprocess.c"), flags=re.M) == ["files.h", "tokenizer.h", "data.c"],
       "preprocess.c sits on files.h, tokenizer.h and data.c alone", "")

for room in rooms + ["preprocess.c"]:
    lines = read(room).count("\n")
    longest = LONGEST_FAMILY if room.startswith("kernels/") else LONGEST
    report(lines <= longest, "%s is %d lines, at most %d" % (room, lines, longest), "%d lines" % lines)

print("%s" % ("ok" if not failed else "%d failed" % failed))
sys.exit(1 if failed else 0)

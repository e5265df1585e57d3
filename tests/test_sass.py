#!/usr/bin/env python3
"""tests/test_sass.py — the GPU build checked where no GPU is: what `make gpu` compiles for each
GPU_ARCH, and the fused attention's kernels as the compiler emits them (issue 25).

1. `make gpu` and the architectures (no nvcc needed: stand-in nvcc scripts say which CUDA they
   are): a GPU_ARCH before sm_80 (70: V100) builds train_gpu_fp16 alone under CUDA 12, and under
   CUDA 13, which cannot compile for sm_70, is refused in one line naming the nvcc before
   anything compiles; train_gpu (bf16) with such a GPU_ARCH is refused too. With the real nvcc:
   the fp16 kernels compile for the oldest architecture before sm_80 that it has (sm_75 under
   CUDA 13; sm_70 under CUDA 12), as `make gpu GPU_ARCH=70` (or 75) needs.
2. The compiled flash kernels. train.c is compiled to a cubin for sm_80 and sm_90, in bf16 and
   in fp16 (-DGRIDGPT_FP16), with the Makefile's device flags (NVCC_DEVICE_FLAGS) and ptxas's
   resource report (-Xptxas -v), and disassembled with nvdisasm. Every kernel whose name
   contains "flash" (template instances too: the names are demangled with c++filt) must keep
   these rules, each checked in the report or in the SASS:
     spills         ptxas reports no spill stores and no spill loads;
     local memory   no stack frame, no lmem, no LDL / STL instruction;
     generic LD/ST  no generic load or store (LD, ST: no G, S or L in the opcode), which is how
                    shared memory is read once the compiler has lost its state space (a tile
                    reached through a pointer it cannot trace, or nvcc 13.0's bf16 WMMA
                    loads); a kernel's global loads are LDG, its shared ones LDS or LDSM;
     LDSM, HMMA     fragments loaded by ldmatrix (LDSM) and multiplied on the tensor cores by
                    mma.sync (HMMA). Exempt: a kernel whose name contains "flash_d_", the
                    backward's D = rowsum(dout * out), a sum with no matrix product in it;
     ALiBi          a kernel built without ALiBi (its last template argument `false`:
                    attention_forward_flash_kernel<64, false, false>) has no ALiBi arithmetic: no
                    int-to-float conversion rounded to nearest (I2F on sm_80, I2FP.F32.S32 on
                    sm_90), the (float)(key - row) of the bias, one a score. (The integer
                    divisions' I2F.RP and I2F.U32.RP, in every instance, are not that.) And a
                    kernel built with it (`true`) must have them: the signature is still the
                    one the compiler emits, so that the rule cannot pass by looking for nothing;
     LDSM per HMMA  in the kernel's inner loop (of the loops, a branch back to a label above it, the
                    one with the most HMMA), at most LDSM_PER_HMMA's ldmatrix per tensor-core
                    product for its kernel and head size (0.6 for another kernel): each fragment
                    loaded from shared memory must feed enough products. Issue 39's tiles: the
                    forward 0.5 (the queries' fragments in registers, each key or value fragment
                    feeds 2 products), the backward 0.6 (at head size 64 K's fragments in
                    registers; dQ's products 32 rows a warp, each K fragment feeding 4). Before,
                    0.56 to 0.67 (the forward's queries loaded in the loop, the backward's 7
                    products in two kernels);
     fences         in the kernel's inner loop (the same loop, loops nested in it included) at most
                    one fence (MEMBAR) and one L1 invalidation (CCTL.IVALL), and no MEMBAR.SC: the
                    backward's dQ turn (issue 52) is one acquire load of the counter (ld.acquire.gpu:
                    a load from L2 and a CCTL.IVALL) and one release store (st.release.gpu:
                    MEMBAR.ALL.GPU and a store), each in one thread. Before, two __threadfence a
                    turn, each a MEMBAR.SC.GPU and a CCTL.IVALL, the second in every thread;
     launched       attention_forward or attention_backward launches it, at some head size
                    from 16 to 128: tests/sass_launches.cpp, built against the CUDA emulation,
                    calls them with a LAUNCH that records each launch's block size and dynamic
                    shared memory instead of running it;
     fits           each such launch fits on the SM (at least one block per SM).
   Every flash kernel kernels/ defines must be in the cubin (a template nothing
   instantiates is not). Then a table per kernel, architecture and precision: registers, shared
   memory (static from ptxas, dynamic from the launcher), spills, and the theoretical
   occupancy. docs/gpu-kernels.md carries the same table (`python3 tests/test_sass.py
   --update-docs` writes it); it must equal this one when made by the same nvcc.
3. Each rule fires: tests/sass_planted.cu's kernels, compiled the same way, each break what
   they are planted to break (a spill, a local array, a lost state space in the kernel and in
   a helper it calls, no tensor cores; ALiBi's bias in an instance built without it, and an
   instance built with it that computes none; a loop that loads both operands of every product
   by ldmatrix; a loop that takes a turn with two __threadfence, beside one that takes it as the
   backward does; with
   made-up launches, one too large for sm_80 and one missing; a template never instantiated),
   its good kernel and its D kernel nothing; and the occupancy arithmetic gives the figures
   worked out by hand below, among them issue 25's review's.

Tools: nvcc (NVCC, on PATH, or /usr/local/cuda/bin), nvdisasm (NVDISASM, on PATH, beside
nvcc, or PyPI's nvidia-cuda-nvdisasm in /usr/bin/python3's `nvidia` package), c++filt. Where
nvcc or nvdisasm is missing, one SKIP line says so; with REQUIRE_NVDISASM=1 (CI) a FAIL.
Prints one PASS/FAIL/SKIP line per check; the tables go to standard output after them.
"""
import concurrent.futures
import glob
import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
BUILD = os.path.join(ROOT, "tests", "build", "sass")
DOC = os.path.join(ROOT, "docs", "gpu-kernels.md")
DOC_BEGIN = "<!-- the compiled flash kernels: written by python3 tests/test_sass.py --update-docs -->"
DOC_END = "<!-- end of the compiled flash kernels -->"
ARCHS = (80, 90)
PRECISIONS = (("bf16", []), ("fp16", ["-DGRIDGPT_FP16"]))
EXEMPT_FROM_TENSOR_CORES = "flash_d_"   # the backward's D kernel: a row sum, no matrix product
failed = 0


def report(ok, name, why=""):
    global failed
    print(("PASS " if ok else "FAIL ") + name + ("" if ok else ": " + why), flush=True)
    failed += not ok


def skip_or_fail(name, why):
    """a check that cannot run: SKIP, or FAIL where CI requires it (REQUIRE_NVDISASM=1)"""
    if os.environ.get("REQUIRE_NVDISASM") == "1":
        report(False, name, why + " (REQUIRE_NVDISASM=1)")
    else:
        print("SKIP " + name + ": " + why, flush=True)


def run(command, **kwargs):
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, **kwargs)


# ----------------------------------------------------------------------------
# the SM's limits and the theoretical occupancy

# CUDA C++ Programming Guide, "Features and Technical Specifications", per compute capability
# (8.0: A100, 9.0: H100): 65,536 32-bit registers per SM and per block, 255 per thread; 2,048
# resident threads (64 warps) and 32 resident blocks per SM; 1,024 threads per block; shared
# memory per SM 164 KB (8.0) and 228 KB (9.0), per block 163 KB and 227 KB (the guide's notes
# on 8.x and 9.0: 1 KB of each block's shared memory is reserved for the system, which the
# runtime reports as cudaDevAttrReservedSharedMemoryPerBlock).
REGISTERS_PER_SM = 65536
REGISTERS_PER_BLOCK = 65536
THREADS_PER_BLOCK = 1024
WARPS_PER_SM = 64
BLOCKS_PER_SM = 32
SHARED_PER_SM = {80: 164 * 1024, 90: 228 * 1024}
SHARED_PER_BLOCK = {80: 163 * 1024, 90: 227 * 1024}
SHARED_RESERVED_PER_BLOCK = 1024
# How they are handed out (NVIDIA's occupancy calculator, in Nsight Compute, for 8.x and 9.0):
# registers per warp in units of 256, shared memory per block in units of 128 bytes; and the
# register file is split over the SM's four partitions (A100 and H100 whitepapers: four
# processing blocks, 16,384 registers each), each holding whole warps.
REGISTER_UNIT = 256
SHARED_UNIT = 128
PARTITIONS = 4


def round_up(x, unit):
    return -(-x // unit) * unit


def occupancy(arch, registers, threads, shared):
    """(blocks per SM, warps per SM, what limits it) for a kernel of `registers` per thread,
    launched with `threads` per block and `shared` bytes of shared memory (static + dynamic);
    0 blocks (and why) when the launch does not fit at all. Shared memory is taken at the
    SM's largest configuration (the carveout the driver can choose)."""
    warps = -(-threads // 32)
    registers_per_warp = round_up(max(registers, 1) * 32, REGISTER_UNIT)
    if threads > THREADS_PER_BLOCK:
        return 0, 0, f"{threads} threads per block, above {THREADS_PER_BLOCK}"
    if registers_per_warp * warps > REGISTERS_PER_BLOCK:
        return 0, 0, f"{registers_per_warp * warps} registers per block, above {REGISTERS_PER_BLOCK}"
    if shared > SHARED_PER_BLOCK[arch]:
        return 0, 0, f"{shared} bytes of shared memory per block, above sm_{arch}'s {SHARED_PER_BLOCK[arch]}"
    warps_by_registers = REGISTERS_PER_SM // PARTITIONS // registers_per_warp * PARTITIONS
    limits = {
        "blocks": BLOCKS_PER_SM,
        "threads": WARPS_PER_SM // warps,
        "registers": warps_by_registers // warps,
        "shared memory": SHARED_PER_SM[arch] // round_up(shared + SHARED_RESERVED_PER_BLOCK, SHARED_UNIT),
    }
    blocks = min(limits.values())
    return blocks, blocks * warps, ", ".join(name for name, n in limits.items() if n == blocks)


# ----------------------------------------------------------------------------
# the tools

def find_nvcc():
    for candidate in (os.environ.get("NVCC"), shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if candidate and shutil.which(candidate):
            return shutil.which(candidate)
    return None


def find_nvdisasm(nvcc):
    """NVDISASM, nvdisasm on PATH, the toolkit's beside nvcc, or PyPI's nvidia-cuda-nvdisasm
    (where /usr/bin/python3, or this Python, has the `nvidia` package: nvidia/*/bin/)"""
    candidates = [os.environ.get("NVDISASM"), shutil.which("nvdisasm")]
    if nvcc:
        candidates.append(os.path.join(os.path.dirname(os.path.realpath(nvcc)), "nvdisasm"))
    for python in dict.fromkeys(("/usr/bin/python3", sys.executable)):
        if not os.path.exists(python):
            continue
        found = run([python, "-c", "import nvidia; print('\\n'.join(nvidia.__path__))"])
        for package in found.stdout.split("\n") if found.returncode == 0 else []:
            if package:
                candidates += sorted(glob.glob(os.path.join(package, "*", "bin", "nvdisasm")))
    for candidate in candidates:
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def tool_release(tool):
    found = re.search(r"release ([0-9.]+), V([0-9.]+)", run([tool, "--version"]).stdout)
    return found.group(2) if found else "unknown"


def makefile_device_flags():
    """the Makefile's NVCC_DEVICE_FLAGS: the flags that shape the GPU build's machine code"""
    with open(os.path.join(ROOT, "Makefile")) as f:
        found = re.search(r"^NVCC_DEVICE_FLAGS\s*:=\s*(.*)$", f.read(), flags=re.M)
    return found.group(1).split()


def demangle(names):
    names = list(names)
    if not names:
        return {}
    out = subprocess.run(["c++filt"], input="\n".join(names) + "\n", capture_output=True, text=True).stdout
    return dict(zip(names, out.rstrip("\n").split("\n")))


def short_name(demangled):
    """a demangled function name without its parameters and return type: the kernel's name,
    with a template instance's arguments (attention_forward_flash_kernel<64>)"""
    depth, start = 0, 0
    for i, c in enumerate(demangled):
        if c == "<":
            depth += 1
        elif c == ">":
            depth -= 1
        elif c == " " and depth == 0:
            start = i + 1
        elif c == "(" and depth == 0:
            return demangled[start:i]
    return demangled[start:]


# ----------------------------------------------------------------------------
# compiling, and reading what the compiler says

def compile_cubin(nvcc, nvdisasm, source, arch, defines, label):
    """source compiled for sm_<arch> to a cubin; returns (ptxas's report, the SASS or None, the
    error if it did not compile)"""
    cubin = os.path.join(BUILD, f"{label}.cubin")
    command = [nvcc, "-x", "cu"] + makefile_device_flags() + [
        "-gencode", f"arch=compute_{arch},code=sm_{arch}", "-cubin", "-Xptxas", "-v", "-DOMPI_SKIP_MPICXX", "-I."]
    command += run(["mpicc", "--showme:compile"]).stdout.split() + defines + [source, "-o", cubin]
    built = run(command)
    with open(os.path.join(BUILD, f"{label}.ptxas.log"), "w") as f:
        f.write(" ".join(command) + "\n" + built.stdout + built.stderr)
    if built.returncode != 0:
        return None, None, (built.stdout + built.stderr).strip()[-600:]
    sass = None
    if nvdisasm:
        disassembled = run([nvdisasm, "-c", cubin])
        if disassembled.returncode != 0:
            return None, None, "nvdisasm: " + disassembled.stderr.strip()[-300:]
        sass = disassembled.stdout
        with open(os.path.join(BUILD, f"{label}.sass"), "w") as f:
            f.write(sass)
    return built.stdout + built.stderr, sass, None


def parse_ptxas(report_text):
    """per mangled kernel (entry function): registers, static shared memory, lmem, stack frame,
    spill stores and loads, in bytes, from ptxas -v"""
    kernels, entry, properties_of = {}, None, None
    for line in report_text.split("\n"):
        m = re.search(r"Compiling entry function '(\S+)'", line)
        if m:
            entry = m.group(1)
            kernels[entry] = {"registers": 0, "shared": 0, "lmem": 0, "stack": 0, "spill stores": 0, "spill loads": 0}
        m = re.search(r"Function properties for (\S+)", line)
        if m:
            properties_of = m.group(1)
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and properties_of in kernels:
            kernels[properties_of].update(zip(("stack", "spill stores", "spill loads"), map(int, m.groups())))
        m = re.search(r"Used (\d+) registers", line)
        if m and entry in kernels:
            kernels[entry]["registers"] = int(m.group(1))
            for key, pattern in (("shared", r"(\d+) bytes smem"), ("lmem", r"(\d+) bytes lmem")):
                found = re.search(pattern, line)
                kernels[entry][key] = int(found.group(1)) if found else 0
    return kernels


def parse_sass(sass):
    """per mangled kernel: its instructions, each as (opcode, the instruction's text), and its
    labels (branch targets) in their places as ("LABEL", the label). A whole program's ptxas puts
    what a kernel calls (a __noinline__ helper, its own subroutines such as 64-bit division) into
    the kernel's section, so the section is all the code it runs."""
    kernels, current = {}, None
    for line in sass.split("\n"):
        m = re.match(r"\s*\.section\s+\.text\.([^,\s]+)", line)
        if m:
            current = kernels.setdefault(m.group(1), [])
            continue
        m = re.match(r"^(\.L_x_\d+):", line)
        if m and current is not None:
            current.append(("LABEL", m.group(1)))
            continue
        m = re.match(r"\s+/\*[0-9a-f]+\*/\s+(.*?)\s*;", line)
        if m and current is not None:
            text = re.sub(r"^@!?U?P\w+\s+", "", m.group(1))   # the predicate, if any
            text = re.sub(r"\s+", " ", text)
            current.append((text.split()[0], text))
    return kernels


# LDSM per HMMA in the inner loop, at most (see the header): by kernel and head size; 0.6 elsewhere
LDSM_PER_HMMA = {("attention_forward_flash_kernel", "64"): 0.5, ("attention_forward_flash_kernel", "128"): 0.5,
                 ("attention_backward_flash_kernel", "64"): 0.6, ("attention_backward_flash_kernel", "128"): 0.6}
LDSM_PER_HMMA_ELSE = 0.6
# fences (MEMBAR) and L1 invalidations (CCTL.IVALL) in the inner loop, at most (see the header)
MAX_LOOP_FENCES = 1


def inner_loop_body(instructions):
    """the opcodes of the kernel's inner loop: of its loops (a branch back to a label above it:
    the body from the label to the branch, loops nested in it included), the one with the most
    HMMA, the shortest of those; None where no loop has an HMMA"""
    labels, body, best = {}, [], None
    for op, text in instructions:
        if op == "LABEL":
            labels[text] = len(body)
            continue
        body.append(op)
        target = re.search(r"\((\.L_x_\d+)\)", text) if op.startswith("BRA") else None
        if target and target.group(1) in labels:
            loop = body[labels[target.group(1)]:]
            hmma = sum(o.split(".")[0] == "HMMA" for o in loop)
            if hmma and (best is None or (hmma, -len(loop)) > (best[0], -len(best[1]))):
                best = (hmma, loop)
    return best[1] if best else None


def inner_loop(instructions):
    """(HMMA, LDSM, instructions) in the kernel's inner loop (inner_loop_body); None where no loop has an HMMA"""
    loop = inner_loop_body(instructions)
    if loop is None:
        return None
    bases = [o.split(".")[0] for o in loop]
    return bases.count("HMMA"), bases.count("LDSM"), len(loop)


def loop_fences(instructions):
    """(the fences, MEMBAR.*, and the L1 invalidations, CCTL.IVALL) in the kernel's inner loop"""
    loop = inner_loop_body(instructions) or []
    return [o for o in loop if o.startswith("MEMBAR")], [o for o in loop if o.startswith("CCTL.IVALL")]


def ldsm_per_hmma_limit(name):
    arguments = re.search(r"<(\d+)", name)
    return LDSM_PER_HMMA.get((base_name(name), arguments.group(1) if arguments else ""), LDSM_PER_HMMA_ELSE)


def built_with_alibi(name):
    """True or False from a kernel's last template argument (<64, true>), None where it has none"""
    found = re.search(r"[<,]\s*(true|false)>$", name)
    return None if not found else found.group(1) == "true"


def alibi_conversions(instructions):
    """ALiBi's signature: the int-to-float conversions rounded to nearest (I2F, I2FP.F32.S32), the
    (float)(key - row) of each score's bias; not the ones rounded up (.RP) of an integer division"""
    return [text for op, text in instructions
            if op.split(".")[0] in ("I2F", "I2FP") and not {"RP", "RM", "RZ"} & set(op.split(".")[1:])]


def broken_rules(name, resources, instructions, arch, launches):
    """{rule: evidence} for each rule the kernel breaks (see the file's header), launched as
    launches says ({short name: {(threads, dynamic shared bytes)}})"""
    broken = {}
    if not instructions:
        broken["disassembled"] = "nvdisasm's output has no code for it"
    if name not in launches:
        broken["launched"] = "no launch by attention_forward or attention_backward at head sizes 16-128"
    for threads, dynamic in sorted(launches.get(name, ())):
        blocks, _, why = occupancy(arch, resources["registers"], threads, resources["shared"] + dynamic)
        if blocks == 0:
            broken["fits"] = f"{threads} threads and {dynamic} bytes of dynamic shared memory: {why}"
    if resources["spill stores"] or resources["spill loads"]:
        broken["spills"] = f"{resources['spill stores']} bytes of spill stores, {resources['spill loads']} of spill loads"
    local = [text for op, text in instructions if op.split(".")[0] in ("LDL", "STL")]
    if resources["stack"] or resources["lmem"] or local:
        broken["local memory"] = (f"{resources['stack']} bytes stack frame, {resources['lmem']} bytes lmem, "
                                  f"{len(local)} LDL/STL" + (f" (first: {local[0]})" if local else ""))
    generic = [text for op, text in instructions if op.split(".")[0] in ("LD", "ST")]
    if generic:
        broken["generic LD/ST"] = f"{len(generic)} generic loads/stores (first: {generic[0]})"
    if EXEMPT_FROM_TENSOR_CORES not in name:
        for opcode in ("LDSM", "HMMA"):
            if not any(op.split(".")[0] == opcode for op, _ in instructions):
                broken["no " + opcode] = f"no {opcode} instruction"
    loop = inner_loop(instructions)
    if loop and loop[1] > ldsm_per_hmma_limit(name) * loop[0]:
        broken["LDSM per HMMA"] = (f"its inner loop ({loop[2]} instructions) loads {loop[1]} fragments by ldmatrix for "
                                   f"{loop[0]} tensor-core products, {loop[1] / loop[0]:.2f} a product, above "
                                   f"{ldsm_per_hmma_limit(name)}")
    fences, invalidations = loop_fences(instructions)
    if any(".SC" in f for f in fences) or len(fences) > MAX_LOOP_FENCES or len(invalidations) > MAX_LOOP_FENCES:
        broken["fences"] = (f"its inner loop has {len(fences)} fence(s) ({', '.join(fences) or 'none'}) and "
                            f"{len(invalidations)} L1 invalidation(s) (CCTL.IVALL): at most {MAX_LOOP_FENCES} of each "
                            "(a turn's release and acquire), and no sequentially consistent fence (MEMBAR.SC: __threadfence)")
    alibi, conversions = built_with_alibi(name), alibi_conversions(instructions)
    if alibi is False and conversions:
        broken["ALiBi arithmetic"] = (f"{len(conversions)} int-to-float conversions, ALiBi's (key - row), in an "
                                      f"instance built without ALiBi (first: {conversions[0]})")
    if alibi is True and not conversions:
        broken["ALiBi signature"] = ("no int-to-float conversion in an instance built with ALiBi: the rule's "
                                     "signature is not what the compiler emits for the bias any more")
    return broken


def flash_kernels_in_source(path):
    """the names of the __global__ functions a source defines with "flash" in their name"""
    with open(os.path.join(ROOT, path)) as f:
        code = re.sub(r"//[^\n]*|/\*.*?\*/", " ", f.read(), flags=re.S)
    names = re.findall(r"__global__\s+void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)\s*\(", code)
    return sorted({n for n in names if "flash" in n})


def compiled_flash_kernels(ptxas_kernels, sass_kernels):
    """{short name: (mangled, resources, instructions)} for the cubin's flash kernels"""
    names = demangle(ptxas_kernels)
    return {short_name(names[m]): (m, ptxas_kernels[m], sass_kernels.get(m, []))
            for m in ptxas_kernels if "flash" in names[m]}


def base_name(kernel):
    return kernel.split("<")[0]


# ----------------------------------------------------------------------------
# 1. make gpu and the architectures

def stand_in_nvcc(release, archs):
    path = os.path.join(BUILD, f"nvcc-{release}")
    with open(path, "w") as f:
        f.write("#!/bin/sh\n# a stand-in for nvcc: its version and architectures, nothing else\n"
                f'echo "$@" >> {path}.asked\ncase "$1" in\n  --version) echo "Cuda compilation tools, release {release}, V{release}.0" ;;\n'
                f"  --list-gpu-arch) printf '%s\\n' {' '.join('compute_' + a for a in archs)} ;;\nesac\n")
    os.chmod(path, 0o755)
    return path


def check_make_architectures(nvcc):
    cuda12 = stand_in_nvcc("12.4", ["50", "52", "60", "61", "70", "72", "75", "80", "86", "89", "90"])
    cuda13 = stand_in_nvcc("13.0", ["75", "80", "86", "89", "90", "100", "120"])

    quiet_env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}

    def make(*args):   # make -n -B: the commands make would run, none run (and no make check's flags)
        return run(["make", "--no-print-directory", "-n", "-B"] + list(args), env=quiet_env)

    def compiles(out):   # the binaries make would compile
        return sorted(set(re.findall(r" -o (train_gpu\w*)", out.stdout)))

    done = make("gpu", "GPU_ARCH=70", "NVCC=" + cuda12)
    arch_flags = sorted(set(re.findall(r"code=sm_(\d+)", done.stdout)))
    report(done.returncode == 0 and compiles(done) == ["train_gpu_fp16"] and arch_flags == ["70"],
           "make gpu GPU_ARCH=70 with CUDA 12 compiles train_gpu_fp16 alone, for sm_70",
           f"status {done.returncode}, compiles {compiles(done)} for {arch_flags}: {done.stderr.strip()[:300]}")
    asked = cuda13 + ".asked"
    if os.path.exists(asked):
        os.remove(asked)
    done = make("gpu", "NVCC=" + cuda13)
    report(done.returncode == 0 and compiles(done) == ["train_gpu", "train_gpu_fp16"] and not os.path.exists(asked),
           "make gpu (GPU_ARCH 80 90) compiles both binaries and asks nvcc nothing",
           f"compiles {compiles(done)}; nvcc asked: {os.path.exists(asked)}")
    for arch in ("70", "70 80"):
        done = make("gpu", f"GPU_ARCH={arch}", "NVCC=" + cuda13)
        lines = done.stderr.strip().split("\n")
        report(done.returncode != 0 and len(lines) == 1 and "CUDA 13.0" in lines[0] and "sm_70" in lines[0]
               and "CUDA 12" in lines[0] and not compiles(done),
               f'make gpu GPU_ARCH="{arch}" with CUDA 13 is refused in one line naming the nvcc, before compiling: '
               + lines[0][:160],
               f"status {done.returncode}, {len(lines)} line(s), compiles {compiles(done)}: {done.stderr.strip()[:300]}")
    done = make("train_gpu", "GPU_ARCH=70 80", "NVCC=" + cuda12)
    lines = done.stderr.strip().split("\n")
    report(done.returncode != 0 and len(lines) == 1 and "bf16" in lines[0] and not compiles(done),
           'make train_gpu GPU_ARCH="70 80" (bf16 on sm_70) is refused in one line', done.stderr.strip()[:300])
    if nvcc:   # the real nvcc refuses as the stand-in did, or (CUDA 12) compiles the fp16 binary alone
        done = make("gpu", "GPU_ARCH=70", "NVCC=" + nvcc)
        can = "compute_70" in run([nvcc, "--list-gpu-arch"]).stdout
        expected = done.returncode == 0 and compiles(done) == ["train_gpu_fp16"] if can else \
            done.returncode != 0 and len(done.stderr.strip().split("\n")) == 1 and not compiles(done)
        report(expected, f"make gpu GPU_ARCH=70 with this nvcc ({tool_release(nvcc)}): "
               + ("train_gpu_fp16 alone" if can else "refused: " + done.stderr.strip()[:160]),
               f"status {done.returncode}, compiles {compiles(done)}: {done.stderr.strip()[:300]}")


# ----------------------------------------------------------------------------
# 2. the compiled flash kernels

def launches_of_the_launchers():
    """{kernel short name: {(threads, dynamic shared bytes)}} from tests/sass_launches.cpp, and
    the error if it did not build or run"""
    program = os.path.join(BUILD, "sass_launches")
    built = run(["g++", "-std=c++20", "-O0", "-Wall", "-Wextra", "-Wno-unused-function", "-fopenmp", "-x", "c++",
                 "-D__CUDACC__", "-I.", "-Itests/emu", "tests/sass_launches.cpp", "-o", program, "-rdynamic", "-lm"])
    if built.returncode != 0:
        return None, "tests/sass_launches.cpp did not build: " + built.stderr.strip()[:600]
    ran = run([program])
    with open(os.path.join(BUILD, "sass_launches.log"), "w") as f:
        f.write(ran.stdout + ran.stderr)
    if ran.returncode != 0:
        return None, f"tests/sass_launches exited with status {ran.returncode}: {ran.stderr.strip()[:300]}"
    launches = {}
    for kernel, threads, shared in re.findall(r"^launch (.+?) (\d+) (\d+) hs=", ran.stdout, flags=re.M):
        launches.setdefault(kernel, set()).add((int(threads), int(shared)))
    return launches, None


def table_rows(arch, precision, kernels, launches):
    rows = []
    for name in sorted(kernels):
        _, res, _ = kernels[name]
        spills = f"{res['spill stores']} / {res['spill loads']}"
        for threads, dynamic in sorted(launches.get(name, {(None, None)})):
            if threads is None:
                rows.append(f"| `{name}` | sm_{arch} | {precision} | {res['registers']} | {res['shared']} | ? | ? "
                            f"| {spills} | ? | ? | ? | no launch seen |")
                continue
            blocks, warps, limit = occupancy(arch, res["registers"], threads, res["shared"] + dynamic)
            rows.append(f"| `{name}` | sm_{arch} | {precision} | {res['registers']} | {res['shared']} | {dynamic} "
                        f"| {threads} | {spills} | {blocks} | {warps} | {100 * warps / WARPS_PER_SM:.1f}% | {limit} |")
    return rows


TABLE_HEADER = ["| kernel | arch | type | registers | shared static (B) | shared dynamic (B) | threads "
                "| spill stores / loads (B) | blocks / SM | warps / SM | occupancy | limited by |",
                "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]


def source_commit():
    """the commit the table is made at, and whether the sources differ from it"""
    commit = run(["git", "rev-parse", "--short", "HEAD"]).stdout.strip() or "unknown"
    dirty = run(["git", "status", "--porcelain", "--", "*.c", "*.h", "*.cuh", "Makefile"]).stdout.strip()
    return commit + (" with changes to the sources not yet committed" if dirty else "")


# where the table is kept: docs/gpu-kernels.md, every row (the README points there and opens with
# what to type)
DOC_COPIES = [(DOC, "docs/gpu-kernels.md", lambda row: True)]


def check_docs(rows, nvcc_release, nvdisasm_release, update):
    for path, name, keep in DOC_COPIES:
        check_doc(path, name, [r for r in rows if keep(r)], nvcc_release, nvdisasm_release, update)


def check_doc(path, name, rows, nvcc_release, nvdisasm_release, update):
    with open(path) as f:
        doc = f.read()
    if DOC_BEGIN not in doc or DOC_END not in doc:
        report(False, f"{name} has the compiled kernels' table", f"no '{DOC_BEGIN}' ... '{DOC_END}' section")
        return
    before, rest = doc.split(DOC_BEGIN, 1)
    section, after = rest.split(DOC_END, 1)
    if update:
        made = (f"\nMade by `python3 tests/test_sass.py --update-docs` from commit {source_commit()}, with nvcc "
                f"{nvcc_release} (`{' '.join(makefile_device_flags())}`) and nvdisasm {nvdisasm_release}:\n\n")
        with open(path, "w") as f:
            f.write(before + DOC_BEGIN + made + "\n".join(TABLE_HEADER + rows) + "\n\n" + DOC_END + after)
        print(f"wrote the table into {name}")
        return
    made_with = re.search(r"with nvcc (\S+)", section)
    if not made_with or made_with.group(1) != nvcc_release:
        print(f"SKIP {name}'s table against this one: it was made with nvcc "
              f"{made_with.group(1) if made_with else '(not said)'}, this is nvcc {nvcc_release}")
        return
    documented = [line for line in section.split("\n") if line.startswith("| `")]
    missing = [r for r in rows if r not in documented]
    stale = [r for r in documented if r not in rows]
    report(not missing and not stale, f"{name}'s table of the compiled flash kernels is this one",
           f"{len(missing)} row(s) differ, first: {(missing or stale)[0] if missing or stale else ''} "
           "(run python3 tests/test_sass.py --update-docs)")


# ----------------------------------------------------------------------------
# 3. the rules fire: planted kernels, and the occupancy worked by hand

PLANTED = {   # kernel: the rules it must break, exactly (on sm_80, and on sm_90 where that differs)
    "planted_flash_good_kernel<1>": set(),
    "planted_flash_good_kernel<2>": {"fits"},   # sm_90 takes it: PLANTED_ON_SM90
    "planted_flash_good_kernel<3>": {"launched"},
    "planted_flash_spill_kernel": {"spills", "local memory"},
    "planted_flash_local_kernel": {"local memory"},
    "planted_flash_generic_kernel": {"generic LD/ST"},
    "planted_flash_callee_kernel": {"generic LD/ST"},
    "planted_flash_notensor_kernel": {"no LDSM", "no HMMA"},
    "planted_flash_d_kernel": set(),
    "planted_flash_alibi_kernel<false>": {"ALiBi arithmetic"},
    "planted_flash_alibi_kernel<true>": set(),
    "planted_flash_nobias_kernel<true>": {"ALiBi signature"},
    "planted_flash_reload_kernel": {"LDSM per HMMA"},
    "planted_flash_turn_kernel": set(),
    "planted_flash_fence_kernel": {"fences"},
}


PLANTED_ON_SM90 = {"planted_flash_good_kernel<2>": set()}
# made-up launches: one warp and no dynamic shared memory, but <2> asks for 170 KB, more than a
# block may have on sm_80 (163 KB) and less than on sm_90 (227 KB); <3> is never launched
PLANTED_LAUNCHES = {name: {(32, 0)} for name in PLANTED if name != "planted_flash_good_kernel<3>"}
PLANTED_LAUNCHES["planted_flash_good_kernel<2>"] = {(32, 170 * 1024)}


def check_planted(arch, kernels):
    for name, expected in PLANTED.items():
        if arch == 90:
            expected = PLANTED_ON_SM90.get(name, expected)
        if name not in kernels:
            report(False, f"planted sm_{arch}: {name}", "not in the cubin")
            continue
        _, res, instructions = kernels[name]
        broken = broken_rules(name, res, instructions, arch, PLANTED_LAUNCHES)
        what = ", ".join(sorted(broken)) or "nothing"
        if EXEMPT_FROM_TENSOR_CORES in name:   # the exemption is shown only if there was something to exempt
            tensor = [op for op, _ in instructions if op.split(".")[0] in ("LDSM", "HMMA")]
            report(not tensor, f"planted sm_{arch}: {name} has no LDSM and no HMMA", f"it has {len(tensor)}")
            what += " (exempt from LDSM/HMMA by its name)"
        report(set(broken) == expected, f"planted sm_{arch}: {name} breaks {what}"
               + (", as planted" if expected else "") + ("" if not broken else f" ({'; '.join(broken.values())})"),
               f"planted to break {', '.join(sorted(expected)) or 'nothing'}")
    missing = [n for n in flash_kernels_in_source("tests/sass_planted.cu")
               if not any(base_name(k) == n for k in kernels)]
    report(missing == ["planted_flash_never_kernel"],
           f"planted sm_{arch}: the template nothing instantiates is found missing from the cubin ({', '.join(missing)})",
           f"missing: {missing}")


def check_occupancy_by_hand():
    cases = [   # (arch, registers, threads, shared bytes), (blocks, warps, limited by): worked by hand
        # issue 25's review of the forward: 64 threads, 30,976 + 1,024 bytes a block; 228 KB / 32,000 B = 7.3
        ((90, 62, 64, 30976), (7, 14, "shared memory")),
        ((80, 62, 64, 30976), (5, 10, "shared memory")),                 # 164 KB / 32,000 B = 5.2
        ((90, 128, 128, 0), (4, 16, "registers")),                       # 4,096 registers a warp: 16 warps
        ((90, 80, 32, 0), (24, 24, "registers")),                        # 2,560 a warp: 6 in each of 4 partitions
        ((90, 32, 256, 0), (8, 64, "threads, registers")),               # 2,048 threads
        ((90, 16, 32, 0), (32, 32, "blocks")),                           # 32 blocks of one warp
        ((80, 64, 128, 170 * 1024), (0, 0, "above sm_80's 166912")),     # over A100's 163 KB a block
        ((90, 64, 128, 170 * 1024), (1, 4, "shared memory")),            # H100 takes it
        ((90, 255, 1024, 0), (0, 0, "registers per block")),             # 8,192 a warp x 32 warps
    ]
    wrong = []
    for args, (blocks, warps, limit) in cases:
        got = occupancy(*args)
        if got[0] != blocks or got[1] != warps or limit not in got[2]:
            wrong.append(f"{args}: {got}, by hand {blocks} blocks, {warps} warps, {limit}")
    report(not wrong, f"the occupancy arithmetic gives the {len(cases)} figures worked out by hand "
           "(issue 25's 7 blocks, 14 warps for the forward on H100 among them)", "; ".join(wrong))


# ----------------------------------------------------------------------------

def main():
    update = "--update-docs" in sys.argv[1:]
    os.makedirs(BUILD, exist_ok=True)
    check_occupancy_by_hand()
    nvcc = find_nvcc()
    check_make_architectures(nvcc)
    if not nvcc:
        skip_or_fail("the compiled flash kernels", "no nvcc (NVCC, PATH or /usr/local/cuda/bin)")
        return
    nvdisasm = find_nvdisasm(nvcc)
    if not shutil.which("c++filt"):
        skip_or_fail("the compiled flash kernels", "no c++filt (binutils)")
        return

    jobs = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        for arch in ARCHS:
            for precision, defines in PRECISIONS:
                jobs[arch, precision] = pool.submit(compile_cubin, nvcc, nvdisasm, "train.c", arch, defines,
                                                    f"train_sm{arch}_{precision}")
            jobs[arch, "planted"] = pool.submit(compile_cubin, nvcc, nvdisasm, "tests/sass_planted.cu", arch, [],
                                                f"planted_sm{arch}")
        # the fp16 kernels for the oldest architecture before sm_80 this nvcc has (make gpu GPU_ARCH=70 or 75)
        older = sorted(int(a) for a in re.findall(r"compute_(\d+)", run([nvcc, "--list-gpu-arch"]).stdout) if int(a) < 80)
        if older:
            jobs["older"] = pool.submit(compile_cubin, nvcc, None, "train.c", older[0], ["-DGRIDGPT_FP16"],
                                        f"train_sm{older[0]}_fp16")
        launches_job = pool.submit(launches_of_the_launchers)
    if older:
        _, _, error = jobs["older"].result()
        report(error is None, f"the fp16 kernels compile for sm_{older[0]}, the oldest architecture before sm_80 "
               f"nvcc {tool_release(nvcc)} has (make gpu GPU_ARCH={older[0]})", error or "")
    for key, job in jobs.items():
        if key != "older" and job.result()[2]:
            report(False, f"compile {key[1]} for sm_{key[0]}", job.result()[2])
            return
    if not nvdisasm:
        skip_or_fail("the compiled flash kernels' SASS", "no nvdisasm (NVDISASM, PATH, beside nvcc, or PyPI's "
                     "nvidia-cuda-nvdisasm for /usr/bin/python3)")
        return
    nvcc_release, nvdisasm_release = tool_release(nvcc), tool_release(nvdisasm)
    print(f"nvcc {nvcc_release} ({nvcc}), nvdisasm {nvdisasm_release} ({nvdisasm})")
    launches, launch_error = launches_job.result()
    report(launch_error is None, "tests/sass_launches.cpp recorded the attention launchers' launches", launch_error or "")
    launches = launches or {}

    in_source = sorted({n for path in sorted(glob.glob(os.path.join(ROOT, "kernels", "*.cuh")))
                        for n in flash_kernels_in_source(os.path.relpath(path, ROOT))})
    rows = []
    for arch in ARCHS:
        for precision, _ in PRECISIONS:
            ptxas_report, sass, _ = jobs[arch, precision].result()
            kernels = compiled_flash_kernels(parse_ptxas(ptxas_report), parse_sass(sass))
            where = f"sm_{arch} {precision}"
            missing = [n for n in in_source if not any(base_name(k) == n for k in kernels)]
            report(in_source and not missing, f"{where}: every flash kernel kernels/ defines is in the cubin "
                   f"({len(in_source)} defined, {len(kernels)} compiled: {', '.join(sorted(kernels))})",
                   f"missing: {', '.join(missing) or 'kernels/ defines none'}")
            for name in sorted(kernels):
                _, res, instructions = kernels[name]
                broken = broken_rules(name, res, instructions, arch, launches)
                count = lambda opcode: sum(op.split(".")[0] == opcode for op, _ in instructions)
                kept = (f"{res['registers']} registers, no spills, no local memory, no generic LD/ST, "
                        + ("exempt from LDSM/HMMA (a row sum)" if EXEMPT_FROM_TENSOR_CORES in name
                           else f"{count('LDSM')} LDSM, {count('HMMA')} HMMA")
                        + ("" if not inner_loop(instructions) else
                           ", inner loop: {1} LDSM for {0} HMMA in {2} instructions".format(*inner_loop(instructions))
                           + ", {} MEMBAR, {} CCTL.IVALL".format(*map(len, loop_fences(instructions))))
                        + {None: "", False: ", no ALiBi arithmetic",
                           True: f", {len(alibi_conversions(instructions))} ALiBi int-to-float conversions"}[
                            built_with_alibi(name)])
                report(not broken, f"{where} {name}: " + (kept if not broken else "breaks " + ", ".join(sorted(broken))),
                       "; ".join(f"{rule}: {why}" for rule, why in sorted(broken.items())))
            rows += table_rows(arch, precision, kernels, launches)
    check_docs(rows, nvcc_release, nvdisasm_release, update)

    for arch in ARCHS:
        ptxas_report, sass, _ = jobs[arch, "planted"].result()
        check_planted(arch, compiled_flash_kernels(parse_ptxas(ptxas_report), parse_sass(sass)))

    print("\nthe compiled flash kernels (occupancy: theoretical, from registers, shared memory + 1 KB reserved "
          "per block, and threads; shared memory at the SM's largest carveout):")
    print("\n".join(TABLE_HEADER + rows))


if __name__ == "__main__":
    main()
    sys.exit(1 if failed else 0)

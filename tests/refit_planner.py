#!/usr/bin/env python3
"""tests/refit_planner.py GPU_CHECK_DIR [--run NAME] [--planner ./train_cpu]
   tests/refit_planner.py --kernels NSYS_CSV STEPS

The planner (plan.h's cost model) refitted to what a GPU measured, in one command: reads the
folder tests/gpu_check.sh wrote and prints the --hw-* flags that make the planner's table agree
with the run NAME (default b16_flash: GPT-2 124M, 16 x 1024, the fused attention), a line for
hardware.h's HARDWARE_PRESETS with them, the same fits as tests/recost.py's constants (its line
"recost.py: --tile-efficiency ... --issue-rate-g ...", given to recost.py as flags: its GEMMs
are the planner's shape model, so a tile's efficiency is the matmul efficiency; its issue rate
scales as the attention efficiency), and the step the
planner then gives for every run in the folder next to its measured one.

What it reads from the folder: hw.txt (the --hw flags the GPU was planned as), run_NAME.flags
(the run's model and batch flags), run_NAME.log (train_gpu's output: its last log line's time
per iteration is the measured step), nsys_NAME.csv and nsys_NAME.steps (nsys's
cuda_gpu_kern_sum report of the same flags over STEPS steps, as CSV).

The kernels are sorted into the planner's kinds of work by name, and each kind fits the one
constant that prices it, in this order (each fit with the ones before it in place):
  other kernels      the memory efficiency: they are priced by their bytes alone, so it scales
                     as planned / measured (not the zeroing memsets: nsys lists them apart);
  GEMMs              the matmul efficiency (cuBLAS's kernels: gemm, xmma, nvjet, cutlass,
                     splitK in the name), against the planner's cuBLAS rows and the epilogue
                     rows that ride in them (GELU's second output, DGELU's read: 0 launches);
  fused attention    the attention efficiency (kernels with flash in the name);
  column reductions  the memory latency (layernorm_backward_kernel, rmsnorm_backward_kernel,
                     column_partials_add_kernel, column_sums_kernel): their chains;
  launch gaps        what is left of the step: (the measured step - the kernels' sum - the
                     planned memsets) / the planner's launches, the device idle a launch.
A fit is a root-finding over one --hw-* flag with ./train_cpu --dry-run as the function (a
secant, kept inside (0, 1] for efficiencies); an efficiency that no value in (0, 1] reaches is
said so, not clipped silently. Flags that this build's config.h does not declare (--help does
not list them) are fitted in closed form where that is exact, else estimated, and given in the
preset line only.

--kernels NSYS_CSV STEPS: the per-kernel table alone (tests/gpu_check.sh writes it next to
each nsys run): a first line with the kinds' sums per step, then the kernels, slowest first.
Standard library only.
"""
import csv
import os
import re
import subprocess
import sys

KINDS = ["GEMMs", "fused attention", "column reductions", "other kernels"]


# ----------------------------------------------------------------------------
# nsys's per-kernel summary


def kernel_kind(name):
    if "flash" in name:
        return KINDS[1]
    if re.search(r"(layernorm|rmsnorm)_backward_kernel|column_partials_add|column_sums_kernel", name):
        return KINDS[2]
    if re.search(r"gemm|xmma|nvjet|cutlass|splitk|cublas", name, re.I):
        return KINDS[0]
    return KINDS[3]


def read_kernels(path, steps):
    """[(name, ms a step, launches a step)] from nsys's cuda_gpu_kern_sum (or gpukernsum) CSV,
    whatever notes come before its header"""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    for i, row in enumerate(rows):
        total = [k for k, h in enumerate(row) if "Total Time" in h]
        count = [k for k, h in enumerate(row) if h.strip() in ("Instances", "Calls", "Count")]
        name = [k for k, h in enumerate(row) if h.strip() == "Name"]
        if total and count and name:
            break
    else:
        sys.exit("%s: no nsys kernel summary in it (a header with Total Time, Instances and Name)" % path)
    out = []
    for row in rows[i + 1:]:
        if len(row) <= max(total[0], count[0], name[0]) or not re.match(r"^[\d.]+$", row[total[0]].strip()):
            continue
        ns, calls = float(row[total[0]]), float(row[count[0]])
        out.append((row[name[0]], ns / 1e6 / steps, calls / steps))
    return sorted(out, key=lambda k: -k[1])


def kind_sums(kernels):
    ms = {k: 0.0 for k in KINDS}
    launches = 0.0
    for name, t, calls in kernels:
        ms[kernel_kind(name)] += t
        launches += calls
    return ms, launches


def print_kernels(path, steps):
    kernels = read_kernels(path, steps)
    ms, launches = kind_sums(kernels)
    print("%.3f ms of kernels a step in %.0f launches: %s" % (sum(ms.values()), launches,
          ", ".join("%s %.3f" % (k, ms[k]) for k in KINDS)))
    print("%10s %9s %10s  %s" % ("ms a step", "launches", "us each", "kernel (%s)" % path))
    for name, t, calls in kernels[:30]:
        print("%10.3f %9.0f %10.1f  %s" % (t, calls, 1e3 * t / calls if calls else 0.0, name[:110]))


# ----------------------------------------------------------------------------
# the planner


class Plan:
    """one --dry-run's table: {row: (launches, ms)}, its step (ms) and its constants"""

    def __init__(self, text):
        self.rows, self.step, inside = {}, None, False
        for line in text.splitlines():
            if re.match(r"stage \d+'s step \(the slowest", line):
                inside = True
                continue
            row = re.match(r"  (.+?)\s+(\d+) \|\s+[\d.]+ \|\s+[\d.]+ \|\s+([\d.]+) \|", line) if inside else None
            if row:
                self.rows[row.group(1).strip()] = (float(row.group(2)), float(row.group(3)))
            elif inside:
                inside = False
            total = re.match(r"step = .* = ([\d.e+-]+) x ([\d.e+-]+) s \+ ([\d.e+-]+) s$", line)
            if total:
                self.step = 1e3 * (float(total.group(1)) * float(total.group(2)) + float(total.group(3)))
        model = re.search(r"^cost model \(--hw (\S+)\): (.*)$", text, re.M)
        if self.step is None or not model:
            sys.exit("the planner printed no cost table:\n" + text[-800:])
        self.preset, line = model.group(1), model.group(2)

        def number(pattern):
            m = re.search(pattern, line)
            return float(m.group(1)) if m else 0.0
        self.constants = {
            "peak_tflops": number(r"([\d.]+) TFLOP/s dense peak"),
            "matmul_efficiency": number(r"x ([\d.]+) matmul efficiency"),
            "attention_efficiency": number(r"x ([\d.]+) attention efficiency"),
            "memory_efficiency": number(r"x ([\d.]+) memory efficiency"),
            "sm_count": number(r"over ([\d.]+) SMs"),
            "memory_gib": number(r"us a kernel launch, ([\d.]+) GiB"),
            "memory_bandwidth": number(r"([\d.]+) GB/s memory"),
            "l2_bandwidth": number(r"L2 ([\d.]+) GB/s"),
            "memory_latency_us": number(r"([\d.]+) us a round trip to memory"),
            "launch_us": number(r"([\d.]+) us a kernel launch"),
            "nvlink_bandwidth": number(r"NVLink ([\d.]+) GB/s"),
            "internode_bandwidth": number(r"network ([\d.]+) GB/s"),
            "gpus_per_node": number(r"([\d.]+) GPUs per node"),
            "latency_us": number(r"([\d.]+) us per message"),
            "reserve_gib": number(r"\(([\d.]+) left to CUDA"),
        }

    def kinds(self):
        """{kind: ms} in the kernels' kinds, and the memsets', the launch gaps' ms and the launches"""
        ms = {k: 0.0 for k in KINDS + ["memsets", "launch gaps", "communication"]}
        launches = 0.0
        for name, (count, t) in self.rows.items():
            if name.startswith("kernel launch gaps"):
                ms["launch gaps"] += t
                launches = count
            elif re.search(r"all-reduce|all-gather|reduce-scatter|send|ZeRO|tied embedding", name):
                ms["communication"] += t
            elif name == "zero gradients":   # cudaMemset: nsys's memory operations, not its kernels
                ms["memsets"] += t
            elif "cuBLAS" in name or count == 0:   # the epilogue rows ride in a GEMM's kernel
                ms[KINDS[0]] += t
            elif name.startswith("attention, fused"):
                ms[KINDS[1]] += t
            elif name in ("layernorm backward", "rmsnorm backward") or name.startswith("bias gradients"):
                # (the GEMM epilogue's bias gradients: the row's launches are column_partials_add's)
                ms[KINDS[2]] += t
            else:
                ms[KINDS[3]] += t
        return ms, launches


def flag_of(field):
    return "--" + field.replace("_", "-")


class Planner:
    def __init__(self, binary, run_flags, hw_flags, declared=None):
        self.binary, self.base = binary, ["--dry-run", "--world-size", "1"] + run_flags + hw_flags
        if declared is None:   # the --hw-* flags this build takes
            help_text = subprocess.run([binary, "--help"], capture_output=True, text=True).stdout
            declared = set(re.findall(r"^\s+(--hw-[a-z-]+)", help_text, re.M))
        self.declared = declared

    def plan(self, fitted):
        """the plan with the fitted numbers given (those --help lists)"""
        extra = []
        for field, value in fitted.items():
            if flag_of("hw_" + field) in self.declared:
                extra += [flag_of("hw_" + field), "%.6g" % value]
        done = subprocess.run([self.binary] + self.base + extra, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit("the planner refused %s: %s" % (" ".join(extra), (done.stdout + done.stderr).strip()[-400:]))
        return Plan(done.stdout)

    def fit(self, fitted, field, kind, measured, lo, hi, inverse):
        """the value of --hw-FIELD in [lo, hi] at which the plan's `kind` takes `measured` ms, or
        None and why no value there gives it. The kind's time is monotone in the value: a secant
        between the last two tries (in 1 / value for an efficiency, which the time is about
        proportional to), kept inside the bracket, else a bisection; to the table's 0.01 ms"""
        def f(x):
            return self.plan(dict(fitted, **{field: x})).kinds()[0][kind] - measured
        u = (lambda x: 1.0 / x) if inverse else (lambda x: x)
        a, fa, b, fb = lo, f(lo), hi, f(hi)
        if fa * fb > 0:
            return None, "%s takes %.3f to %.3f ms over %s %g to %g, not %.3f" % (
                kind, fa + measured, fb + measured, flag_of("hw_" + field), lo, hi, measured)
        tolerance = max(1e-3 * measured, 0.006)
        (x0, f0), (x1, f1) = (a, fa), (b, fb)
        for _ in range(24):
            if f1 != f0:   # the secant's zero, in u
                t = u(x1) - f1 * (u(x1) - u(x0)) / (f1 - f0)
                x = 1.0 / t if inverse and t > 0 else t
            else:
                x = (a + b) / 2
            if not a < x < b:
                x = (a + b) / 2
            fx = f(x)
            if abs(fx) <= tolerance or b - a < 1e-4 * b:
                return x, None
            if (fx < 0) == (fa < 0):
                a, fa = x, fx
            else:
                b, fb = x, fx
            (x0, f0), (x1, f1) = (x1, f1), (x, fx)
        return x, None


# ----------------------------------------------------------------------------
# the folder


def read_text(path):
    with open(path) as f:
        return f.read()


def measured_step(folder, name):
    """the last log line's ms per iteration of run NAME, or None"""
    path = os.path.join(folder, "run_%s.log" % name)
    if not os.path.exists(path):
        return None
    lines = [l for l in read_text(path).splitlines() if re.match(r" (\[[^]]*\] )?iteration", l)]   # dated or older
    m = re.search(r"elapsed time per iteration \(ms\): ([\d.]+)", lines[-1]) if lines else None
    return float(m.group(1)) if m else None


PRESET_ORDER = ["peak_tflops", "matmul_efficiency", "attention_efficiency", "memory_efficiency", "sm_count",
                "memory_gib", "memory_bandwidth", "l2_bandwidth", "memory_latency_us", "launch_us", "nvlink_bandwidth",
                "internode_bandwidth", "gpus_per_node", "latency_us", "reserve_gib"]


def refit(folder, name, binary):
    hw_flags = read_text(os.path.join(folder, "hw.txt")).split()
    run_flags = read_text(os.path.join(folder, "run_%s.flags" % name)).split()
    step = measured_step(folder, name)
    if step is None:
        sys.exit("%s: run %s has no measured step (run_%s.log's log lines)" % (folder, name, name))
    steps = float(read_text(os.path.join(folder, "nsys_%s.steps" % name)).strip())
    kernels = read_kernels(os.path.join(folder, "nsys_%s.csv" % name), steps)
    measured, launches = kind_sums(kernels)
    planner = Planner(binary, run_flags, hw_flags)
    preset = planner.plan({})
    planned, planned_launches = preset.kinds()
    c = preset.constants
    gpu = read_text(os.path.join(folder, "gpu.txt")).strip() if os.path.exists(os.path.join(folder, "gpu.txt")) else "?"
    print("refit of the planner (%s, %s) to run %s in %s (%s): measured step %.2f ms, planned %.2f ms at the preset"
          % (preset.preset, " ".join(hw_flags), name, folder, gpu, step, preset.step))
    fitted, notes = {}, []

    # other kernels: bytes / (bandwidth x efficiency), exactly
    if measured[KINDS[3]] > 0 and planned[KINDS[3]] > 0:
        e = c["memory_efficiency"] * planned[KINDS[3]] / measured[KINDS[3]]
        if e > 1.0:
            notes.append("the other kernels ran faster than the memory bandwidth allows (efficiency %.2f): kept at 1" % e)
        fitted["memory_efficiency"] = min(e, 1.0)
    # GEMMs, the fused attention: their efficiencies, each by the planner
    for field, kind in (("matmul_efficiency", KINDS[0]), ("attention_efficiency", KINDS[1])):
        if measured[kind] <= 0 or planned[kind] <= 0:
            continue
        value, why = planner.fit(fitted, field, kind, measured[kind], 0.01, 1.0, True)
        if value is None:
            notes.append("no %s: %s" % (flag_of("hw_" + field), why))
        else:
            fitted[field] = value
    # the column reductions: the memory latency, by the planner where --hw-memory-latency-us is
    # declared; else in proportion (exact where their chains, not their bytes, price them)
    if measured[KINDS[2]] > 0 and planned[KINDS[2]] > 0:
        at = planner.plan(fitted).kinds()[0][KINDS[2]]
        estimate = c["memory_latency_us"] * measured[KINDS[2]] / at
        if "--hw-memory-latency-us" in planner.declared:
            value, why = planner.fit(fitted, "memory_latency_us", KINDS[2], measured[KINDS[2]], 0.01, 10.0, False)
            if value is None:
                notes.append("no --hw-memory-latency-us: %s" % why)
            else:
                fitted["memory_latency_us"] = value
        else:
            fitted["memory_latency_us"] = estimate
            notes.append("--hw-memory-latency-us is not a flag of this build: %.3f us is in proportion to the "
                         "reductions' time (exact where their chains price them), in the preset line only" % estimate)
    # the launch gaps: the rest of the step
    if planned_launches > 0:
        rest = step - sum(measured.values()) - planned["memsets"]
        fitted["launch_us"] = max(rest, 0.0) * 1e3 / planned_launches
        if rest < 0:
            notes.append("the kernels' sum exceeds the step by %.3f ms: no launch gap left (nsys's kernels were slower "
                         "than the timed run's)" % -rest)
        if fitted["launch_us"] > 10.0:
            notes.append("%.1f us a launch is more than the device's own gap: the host sets the pace there (its "
                         "launches, or a wait for the GPU): the trace's host track says which" % fitted["launch_us"])
        if "--hw-launch-us" not in planner.declared:
            notes.append("--hw-launch-us is not a flag of this build: %.2f us a launch is in the preset line only"
                         % fitted["launch_us"])

    after = planner.plan(fitted)
    refitted, _ = after.kinds()
    print("%-24s%12s%14s%14s" % ("ms a step", "measured", "the preset", "refitted"))
    for kind in KINDS:
        print("%-24s%12.3f%14.3f%14.3f" % (kind, measured[kind], planned[kind], refitted[kind]))
    print("%-24s%12s%14.3f%14.3f" % ("memsets (planned)", "", planned["memsets"], refitted["memsets"]))
    print("%-24s%12.3f%14.3f%14.3f" % ("launch gaps", step - sum(measured.values()) - planned["memsets"],
                                       planned["launch gaps"], refitted["launch gaps"]))
    print("%-24s%12.3f%14.3f%14.3f" % ("the step", step, preset.step, after.step))
    print("launches a step: %.0f in nsys, %.0f planned" % (launches, planned_launches))
    for note in notes:
        print("note: " + note)
    flags = ["%s %.3g" % (flag_of("hw_" + f), v) for f, v in fitted.items() if flag_of("hw_" + f) in planner.declared]
    print("flags: " + " ".join(hw_flags + flags))
    line = dict(c, **fitted)
    print("preset line: [HW_%s] = {%s, 0}," % (preset.preset.upper().replace("-", "_"), ", ".join(
        "%.4g" % line[f] for f in PRESET_ORDER)))   # and cpu_threads 0: a GPU
    # tests/recost.py's constants from the same fits (issue 52 item 3): its GEMMs are priced by the
    # planner's shape model, so a tile's efficiency is the matmul efficiency; its streaming share,
    # latency and launch gap are the planner's
    # latency and launch gap are the planner's; its issue rate (651 G warp instructions a second, its
    # fit to FlashAttention-2's forward) scales as the attention efficiency does: the fused attention
    # is priced by its loops' issue there and by its products here, both in proportion to the time
    recost = [("--tile-efficiency", "matmul_efficiency", 1.0), ("--stream-fraction", "memory_efficiency", 1.0),
              ("--memory-latency-us", "memory_latency_us", 1.0), ("--launch-gap-us", "launch_us", 1.0)]
    if c["attention_efficiency"] > 0:
        recost.append(("--issue-rate-g", "attention_efficiency", 651.0 / c["attention_efficiency"]))
    print("recost.py: " + " ".join("%s %.4g" % (flag, line[field] * scale) for flag, field, scale in recost
                                   if field in fitted))
    if abs(line["memory_bandwidth"] - 3350.0) > 1.0:
        print("note: the folder's GPU was planned at %.0f GB/s, not an H100 SXM's 3350 (tests/recost.py's): the "
              "stream fraction above is of %.0f GB/s" % (line["memory_bandwidth"], line["memory_bandwidth"]))
    # every timed run of the folder, planned with the refit
    for entry in sorted(os.listdir(folder)):
        m = re.match(r"run_(.+)\.flags$", entry)
        other = measured_step(folder, m.group(1)) if m else None
        if other is None:
            continue
        p = Planner(binary, read_text(os.path.join(folder, entry)).split(), hw_flags, planner.declared).plan(fitted)
        print("run %-12s measured %9.2f ms, planned with the refit %9.2f ms (%.2f)" % (m.group(1), other, p.step,
                                                                                      other / p.step))


def main(args):
    if args[:1] == ["--kernels"] and len(args) == 3:
        print_kernels(args[1], float(args[2]))
        return
    if not args or args[0].startswith("-"):
        sys.exit(__doc__.split("\n\n")[0])
    folder, name, binary = args[0], "b16_flash", "./train_cpu"
    i = 1
    while i < len(args):
        if args[i] == "--run":
            name, i = args[i + 1], i + 2
        elif args[i] == "--planner":
            binary, i = args[i + 1], i + 2
        else:
            sys.exit("unknown argument %s\n%s" % (args[i], __doc__.split("\n\n")[0]))
    refit(folder, name, binary)


if __name__ == "__main__":
    main(sys.argv[1:])

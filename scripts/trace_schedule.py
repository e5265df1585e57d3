#!/usr/bin/env python3
"""scripts/trace_schedule.py TRACE.json [--iteration N] [--cells-per-forward C] [--all-ranks] [--plan DRY-RUN]

What a trace written by --profile (docs/profiling.md) says about the pipeline, as text:
  - each profiled step's schedule, one line per stage, the way the papers draw it (Narayanan
    et al. 2021, Fig. 4): F3 is the forward of micro-batch 3 (counted from 1, as there), B3
    its backward; time runs to the right at a fixed time per character (C characters for the
    median forward); '.' where the stage runs neither (waiting in an exchange, or idle: the
    bubble). Where a stage holds several model chunks (an interleaved schedule), a letter
    names the chunk: F3a, F3b;
  - each stage's order of work, one token per forward or backward;
  - the measured bubble of each stage, 1 - (its forwards' and backwards' time) / (the
    schedule's time, from the first forward's start to the last backward's end on any stage),
    next to the planner's (p - 1) / (m + p - 1), or (p - 1) / (v m + p - 1) with v model chunks a
    stage (equal stages, no communication);
  - the time per kind of work on each stage, in ms per step: self time, a span's time less
    its children's (a forward's time less its tensor-parallel all-reduces, ...).
  - --plan DRY-RUN (what `--dry-run` printed for the run's layout, build and a --hw that describes
    the machine): the cost model's table of the slowest stage's step next to that stage's
    measured time, both in the same kinds (the kernels of the forwards and backwards, the
    tensor-parallel and sequence-parallel collectives, the pipeline exchanges, the data-parallel
    and embedding collectives, the optimizer's kernels) with their ratio, and the step's time.
One rank per stage (the first profiled one; --all-ranks: every profiled rank). On the GPU
build the work is read from the compute stream's track, else from the host's. Standard library only.
"""
import json
import re
import statistics
import sys


def load(path):
    with open(path) as f:
        doc = json.load(f)
    tracks = {}
    for e in doc["traceEvents"]:
        if e.get("ph") == "X":
            tracks.setdefault((e["pid"], e["tid"]), []).append(e)
    for spans in tracks.values():
        spans.sort(key=lambda e: (e["ts"], -e["dur"]))
    return doc["otherData"], tracks


def label(e, chunked):
    """F3 / B3 (micro-batch 3 counted from 1), with the chunk's letter where stages hold several"""
    token = "%s%d" % (e["name"][0].upper(), e["args"]["micro_batch"] + 1)
    return token + chr(ord("a") + e["args"].get("chunk", 0)) if chunked else token


def within(spans, step):
    s0, s1 = step["ts"], step["ts"] + step["dur"]
    return [e for e in spans if s0 <= e["ts"] <= s1 and e is not step]


def draw(work, t0, t1, cell, chunked):
    """one stage's line: each span its label, padded to its length in cells; '.' between"""
    line, cursor = "", 0
    for e in work:
        token = label(e, chunked)
        start = max(cursor, round((e["ts"] - t0) / cell))
        stop = max(start + len(token) + 1, round((e["ts"] + e["dur"] - t0) / cell))
        line += "." * (start - cursor) + token.ljust(stop - start)
        cursor = stop
    return line + "." * max(0, round((t1 - t0) / cell) - cursor)


def self_times(spans):
    """{kind: seconds of self time} over spans (sorted by start), a kind being the name and group"""
    out, stack = {}, []   # stack: [end, kind, children's time]
    def close(item):
        end, kind, children, dur = item
        out[kind] = out.get(kind, 0.0) + (dur - children) / 1e6
    for e in spans:
        while stack and stack[-1][0] <= e["ts"]:
            close(stack.pop())
        if stack:
            stack[-1][2] += e["dur"]
        group = e["args"].get("group")
        kind = e["name"] + (" (%s)" % group if group else "")
        stack.append([e["ts"] + e["dur"], kind, 0.0, e["dur"]])
    while stack:
        close(stack.pop())
    return out


# The cost model's rows (plan.h charge_*) and the trace's kinds of work, sorted into the kinds
# both know. A trace's collective is "NAME (GROUP)"; those on host values (the step's loss, the
# checks) and the data loading are not in the cost model.
KINDS = ["forward and backward kernels", "tensor-parallel collectives", "pipeline exchanges",
         "data-parallel and embedding collectives", "optimizer kernels (AdamW, gradient norm)"]


def planned_kind(row):
    if row.startswith("pipeline"):
        return KINDS[2]
    if "tensor-parallel" in row or row.startswith("sequence-parallel"):
        return KINDS[1]
    if row.startswith("ZeRO") or row.startswith("tied embedding") or "data-parallel" in row or "bucket" in row:
        return KINDS[3]
    if row in ("AdamW", "gradient norm", "zero gradients"):
        return KINDS[4]
    return KINDS[0]


def measured_kind(kind):
    if kind in ("forward", "backward", "weights"):
        return KINDS[0]
    if "(host values)" in kind or "(" not in kind:
        return KINDS[4] if kind in ("AdamW", "gradient norm") else None
    group = kind[kind.rindex("(") + 1:-1]
    return {"tensor-parallel": KINDS[1], "pipeline": KINDS[2], "data-parallel": KINDS[3], "embedding": KINDS[3]}.get(group)


def read_plan(path):
    """(stage, {kind: planned ms per step}, planned step s) from a --dry-run's output: the slowest stage's table"""
    stage, rows, step, inside = None, {}, None, False
    for line in open(path):
        head = re.match(r"stage (\d+)'s step \(the slowest", line)
        if head:
            stage, inside = int(head.group(1)), True
            continue
        row = re.match(r"  (.+?)\s+\d+ \|\s+[\d.]+ \|\s+[\d.]+ \|\s+([\d.]+) \|", line) if inside else None
        if row:
            kind = planned_kind(row.group(1).strip())
            rows[kind] = rows.get(kind, 0.0) + float(row.group(2))
        elif inside:
            inside = False
        total = re.match(r"step = .* = ([\d.e+-]+) x ([\d.e+-]+) s \+ ([\d.e+-]+) s$", line)   # slots x slot + optimizer
        if total:
            step = float(total.group(1)) * float(total.group(2)) + float(total.group(3))
    if stage is None or step is None:
        sys.exit("%s: no cost table of a stage and 'step = ...' line of a --dry-run in it" % path)
    return stage, rows, step


def print_against_plan(path, stage, kinds, steps, measured_step):
    """the slowest stage's measured ms per step next to the cost model's, kind by kind"""
    planned_stage, planned, planned_step = read_plan(path)
    if planned_stage != stage["pp"]:
        print("\n(the plan's slowest stage is %d; stage %d measured below)" % (planned_stage, stage["pp"]))
    measured = {}
    for kind, seconds in kinds.items():
        k = measured_kind(kind)
        if k:
            measured[k] = measured.get(k, 0.0) + 1e3 * seconds / steps
    print("\nstage %d against the cost model (%s), ms per step:" % (stage["pp"], path))
    print("%-44s%12s%12s%10s" % ("kind", "measured", "planned", "ratio"))
    for k in KINDS:
        m, p = measured.get(k, 0.0), planned.get(k, 0.0)
        print("%-44s%12.3f%12.3f%10s" % (k, m, p, "%.2f" % (m / p) if p > 0 else "-"))
    print("%-44s%12.3f%12.3f%10.2f" % ("the step", 1e3 * measured_step, 1e3 * planned_step, measured_step / planned_step))


def main(argv):
    args = argv[1:]
    if not args or args[0].startswith("--"):
        sys.exit(__doc__.strip().splitlines()[0])
    path, only, per_forward, all_ranks, plan = args[0], None, 4, False, None
    i = 1
    while i < len(args):
        if args[i] == "--iteration": only, i = int(args[i + 1]), i + 2
        elif args[i] == "--cells-per-forward": per_forward, i = int(args[i + 1]), i + 2
        elif args[i] == "--all-ranks": all_ranks, i = True, i + 1
        elif args[i] == "--plan": plan, i = args[i + 1], i + 2
        else: sys.exit("unknown argument %s; usage: %s" % (args[i], __doc__.strip().splitlines()[0]))
    other, tracks = load(path)
    layout = other["layout"]
    P = layout["pp"]
    device = any(tid == 1 for _, tid in tracks)
    ranks = sorted((r for r in other["ranks"] if r["profiled"]), key=lambda r: (r["pp"], r["rank"]))
    if not all_ranks:
        ranks = [next(r for r in ranks if r["pp"] == p) for p in sorted({r["pp"] for r in ranks})]
    v = 1 + max((e["args"].get("chunk", 0) for spans in tracks.values() for e in spans), default=0)   # model chunks a stage
    chunked = v > 1
    first, last = other["iterations"]
    print("%s: %s, world %d = TP %d x PP %d x DP %d, iterations %d to %d; read from the %s" %
          (path, other["build"], layout["world"], layout["tp"], P, layout["dp"], first, last,
           "compute stream's track (device times)" if device else "host's track"))
    kinds = [{} for _ in ranks]
    bubbles = [[] for _ in ranks]
    step_seconds = [0.0 for _ in ranks]
    for it in range(first, last + 1):
        if only is not None and it != only:
            continue
        rows = []
        for r in ranks:
            spans = tracks.get((r["rank"], 1 if device else 0), [])
            step = next((e for e in spans if e["name"] == "step" and e["args"]["iteration"] == it), None)
            if step is None:
                sys.exit("%s: rank %d has no step span for iteration %d" % (path, r["rank"], it))
            inside = within(spans, step)
            rows.append((r, step, inside, [e for e in inside if e["name"] in ("forward", "backward", "weights")]))
        M = rows[0][1]["args"]["micro_batches"]
        t0 = min(w[0]["ts"] for _, _, _, w in rows if w)
        t1 = max(e["ts"] + e["dur"] for _, _, _, w in rows for e in w)
        forwards = [e["dur"] for _, _, _, w in rows for e in w if e["name"] == "forward"]
        cell = statistics.median(forwards) / per_forward
        print("\niteration %d: %d micro-batches; the schedule, first forward to last backward: %.3f ms; one character "
              "= %.3f ms ('.': neither forward nor backward)" % (it, M, (t1 - t0) / 1e3, cell / 1e3))
        for k, (r, step, inside, work) in enumerate(rows):
            name = "stage %d (rank %d)" % (r["pp"], r["rank"])
            print("%-18s %s" % (name, draw(work, t0, t1, cell, chunked)))
        print("order of work:")
        for k, (r, step, inside, work) in enumerate(rows):
            print("%-18s %s" % ("stage %d (rank %d)" % (r["pp"], r["rank"]), " ".join(label(e, chunked) for e in work)))
            busy = sum(e["dur"] for e in work)
            step_seconds[k] += step["dur"] / 1e6
            bubbles[k].append(1.0 - busy / (t1 - t0))
            for kind, seconds in self_times([step] + inside).items():
                kinds[k][kind] = kinds[k].get(kind, 0.0) + seconds
        if v == 1:
            formula = "(p - 1) / (m + p - 1) = %d / %d" % (P - 1, M + P - 1)
        else:
            formula = "(p - 1) / (v m + p - 1) = %d / %d" % (P - 1, v * M + P - 1)
        print("bubble: " + ", ".join("stage %d %.1f%%" % (r["pp"], 100 * b[-1]) for r, b in zip(ranks, bubbles)) +
              "; the planner's %s = %.1f%%" % (formula, 100.0 * (P - 1) / (v * M + P - 1)))
    steps = len(bubbles[0])
    if steps > 1:
        print("\nbubble, mean of %d steps: " % steps + ", ".join("stage %d %.1f%%" % (r["pp"], 100 * statistics.mean(b))
                                                             for r, b in zip(ranks, bubbles)))
    print("\ntime per kind of work, ms per step (self time: a span's time less its children's; 'step' is the step's "
          "own time between them), mean of %d step(s):" % steps)
    order = sorted({k for d in kinds for k in d}, key=lambda k: -sum(d.get(k, 0.0) for d in kinds))
    print("%-44s" % "kind" + "".join("%12s" % ("stage %d" % r["pp"] if not all_ranks else "rank %d" % r["rank"])
                                      for r in ranks))
    for kind in order:
        print("%-44s" % kind[:44] + "".join("%12.3f" % (1e3 * d.get(kind, 0.0) / steps) for d in kinds))
    if plan:
        slowest = read_plan(plan)[0]
        k = next((k for k, r in enumerate(ranks) if r["pp"] == slowest), 0)
        print_against_plan(plan, ranks[k], kinds[k], steps, step_seconds[k] / steps)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

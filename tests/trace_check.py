#!/usr/bin/env python3
"""tests/trace_check.py TRACE.json [--pp P --micro-batches M | --schedule DRAWING] [--device-streams]
                        [--expect NAME,...] [--profiled R,...] [--name TEXT]

Checks a file written by --profile (trace.h) against Chrome's trace-event format and against
what the run did, one PASS/FAIL line per check (tests/test_trace.sh, tests/test_emu_train.sh):
  - it is JSON: a "traceEvents" array, "displayTimeUnit", and "otherData" with the layout, the
    profiled iterations and the clock alignment (method, accuracy, one offset per rank);
  - every event is well-formed: complete events ("X") with a name, a category, integer pid and
    tid, ts >= 0 and dur >= 0 in microseconds, and args with the iteration; metadata events
    ("M") naming processes and threads; every rank's process and every track is named, and
    every profiled rank has one "step" span per profiled iteration;
  - on one track (pid, tid) spans never overlap unless one lies inside the other (Chrome's
    rule for complete events on one thread): overlap shows only across tracks, i.e. streams;
  - --pp P --micro-batches M: each stage's forwards and backwards in each step come in exactly
    the order of 1F1B (PipeDream-flush; Narayanan et al. 2021): min(P - p - 1, M) warm-up
    forwards, then one forward and one backward in turn, then the backwards still owed; read
    from the device's compute stream where the file has one, else from the host's track;
  - --schedule DRAWING (what `train_cpu --dry-run --print-schedule` printed for the run's layout):
    each stage's forwards and backwards in each step come in exactly the drawing's order, its
    model chunks too (F3a: micro-batch 3's forward through the stage's first chunk), plain or
    interleaved 1F1B;
  - --expect NAME,...: each named kind of span is there, and with its arguments (a pipeline
    exchange its group, peer and bytes; a collective its group and bytes > 0; a forward or
    backward its micro-batch, chunk, stage and layers);
  - --profiled R,...: exactly these ranks were profiled (and have spans), the others none;
  - --device-streams (the GPU build): every rank has spans on the compute stream and on the
    communication stream, and each device span has its host (launch) span of the same name.
Standard library only.
"""
import json
import re
import sys

EPS = 0.002   # microseconds: ts and dur are each written to 1 ns, so an end may round by 1 ns
failed = 0


def report(ok, name, why=""):
    global failed
    print(("PASS " if ok else "FAIL ") + name + ("" if ok else ": " + why))
    failed += not ok


def one_f_one_b(p, P, M):
    """stage p's order of work in one step, as 1F1B runs it: [('F', i), ('B', j), ...]"""
    warmup = min(P - p - 1, M)
    order = [("F", i) for i in range(warmup)]
    for i in range(M - warmup):
        order += [("F", warmup + i), ("B", i)]
    order += [("B", M - warmup + i) for i in range(warmup)]
    return order


def drawn_orders(path):
    """{stage: ["F1a", ...]} from --print-schedule's output: each "stage p:" line's work, the bubble's '.' left out"""
    out = {}
    for line in open(path):
        drawn = re.match(r"stage (\d+): (.*)", line)
        if drawn:
            out[int(drawn.group(1))] = [t for t in drawn.group(2).split() if t != "."]
    return out


def check_nesting(spans):
    """the first pair of spans (sorted by start) that overlap without one inside the other, or None"""
    open_ends = []
    for ts, end, name in sorted(spans, key=lambda s: (s[0], -s[1])):
        while open_ends and open_ends[-1][0] <= ts + EPS:
            open_ends.pop()
        if open_ends and end > open_ends[-1][0] + EPS:
            return "%s [%.3f, %.3f] overlaps %s ending at %.3f" % (name, ts, end, open_ends[-1][1], open_ends[-1][0])
        open_ends.append((end, name))
    return None


def main(argv):
    path, pp, micro, device, label, expect, profiled_want, drawing = argv[1], None, None, False, "", [], None, None
    i = 2
    while i < len(argv):
        if argv[i] == "--pp": pp, i = int(argv[i + 1]), i + 2
        elif argv[i] == "--micro-batches": micro, i = int(argv[i + 1]), i + 2
        elif argv[i] == "--device-streams": device, i = True, i + 1
        elif argv[i] == "--name": label, i = argv[i + 1] + ": ", i + 2
        elif argv[i] == "--expect": expect, i = argv[i + 1].split(","), i + 2
        elif argv[i] == "--profiled": profiled_want, i = [int(r) for r in argv[i + 1].split(",")], i + 2
        elif argv[i] == "--schedule": drawing, i = argv[i + 1], i + 2
        else: sys.exit(__doc__.strip().splitlines()[0])
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        report(False, label + "the trace is JSON", str(e))
        return 1
    other = doc.get("otherData", {})
    clocks = other.get("clock_alignment", {})
    layout = other.get("layout", {})
    world = layout.get("world", 0)
    iterations = other.get("iterations", [0, -1])
    ranks = other.get("ranks", [])
    report(isinstance(doc.get("traceEvents"), list) and doc.get("displayTimeUnit") in ("ms", "ns") and world > 0 and
           len(ranks) == world and all(k in clocks for k in ("method", "accuracy")) and
           len(clocks.get("offsets_us", [])) == world and len(iterations) == 2 and iterations[0] <= iterations[1],
           label + "JSON with traceEvents, displayTimeUnit and otherData (layout, iterations, ranks, clock alignment: "
           "method, accuracy, an offset per rank)", "keys: %s; otherData: %s" % (sorted(doc), sorted(other)))
    events = doc.get("traceEvents", [])
    bad, spans, names, tracks = [], [], {}, {}
    for e in events:
        ph = e.get("ph")
        if ph == "M":
            ok = e.get("name") in ("process_name", "process_sort_index", "thread_name", "thread_sort_index") and \
                isinstance(e.get("pid"), int) and isinstance(e.get("tid"), int) and isinstance(e.get("args"), dict)
            if ok and e["name"].endswith("_name"):
                ok = isinstance(e["args"].get("name"), str) and e["args"]["name"] != ""
                names[(e["name"], e["pid"], e["tid"] if e["name"] == "thread_name" else None)] = e["args"].get("name")
        elif ph == "X":
            ok = isinstance(e.get("name"), str) and isinstance(e.get("cat"), str) and isinstance(e.get("pid"), int) and \
                isinstance(e.get("tid"), int) and isinstance(e.get("ts"), (int, float)) and \
                isinstance(e.get("dur"), (int, float)) and e["ts"] >= 0 and e["dur"] >= 0 and \
                isinstance(e.get("args"), dict) and isinstance(e["args"].get("iteration"), int)
            if ok:
                spans.append(e)
                tracks.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"], e["name"]))
        else:
            ok = False
        if not ok:
            bad.append(e)
    report(not bad and spans, label + "%d events well-formed: %d complete events (X: name, cat, pid, tid, ts >= 0, "
           "dur >= 0, args.iteration) and %d metadata events (M)" % (len(events), len(spans), len(events) - len(spans)),
           "%d malformed, the first: %s" % (len(bad), json.dumps(bad[:1])))
    unnamed = [t for t in tracks if ("process_name", t[0], None) not in names or ("thread_name", t[0], t[1]) not in names]
    report(not unnamed, label + "every rank's process and every track is named (%d tracks: %s)" %
           (len(tracks), "; ".join(sorted(set("%s/%s" % (names.get(("process_name", p, None)), names.get(("thread_name", p, t)))
                                                for p, t in tracks)))[:400]), "unnamed (pid, tid): %s" % unnamed[:4])
    overlaps = [(t, w) for t, s in sorted(tracks.items()) for w in [check_nesting(s)] if w]
    report(not overlaps, label + "on each of the %d tracks spans never overlap unless one lies inside the other" % len(tracks),
           "track (pid, tid) %s: %s" % overlaps[0] if overlaps else "")
    profiled = [r["rank"] for r in ranks if r.get("profiled")]
    want_steps = list(range(iterations[0], iterations[1] + 1))
    steps_ok = all(sorted(e["args"]["iteration"] for e in spans if e["pid"] == r and e["tid"] == 0 and e["name"] == "step")
                   == want_steps for r in profiled)
    report(profiled and steps_ok, label + "each of the %d profiled ranks has one step span per iteration %s" %
           (len(profiled), want_steps), "step spans differ")

    if profiled_want is not None:
        with_spans = sorted({e["pid"] for e in spans})
        report(profiled == profiled_want and with_spans == profiled_want, label + "only --profile-ranks %s were profiled" %
               profiled_want, "profiled %s, with spans %s" % (profiled, with_spans))
    def has_arguments(e):
        a = e["args"]
        if e["cat"] == "pipeline":
            return isinstance(a.get("group"), str) and a.get("peer", -1) >= 0 and a.get("bytes", 0) > 0
        if e["cat"] == "collective":
            return isinstance(a.get("group"), str) and a.get("bytes", 0) > 0
        if e["cat"] == "compute":
            return all(isinstance(a.get(k), int) for k in ("micro_batch", "chunk", "stage", "first_layer", "num_layers"))
        return True
    for name in expect:
        found = [e for e in spans if e["name"] == name]
        report(found and all(has_arguments(e) for e in found), label + "%d '%s' spans, each with its arguments (%s)" %
               (len(found), name, ", ".join(sorted(found[0]["args"])) if found else ""),
               "missing or without arguments: %s" % json.dumps([e for e in found if not has_arguments(e)][:1]))

    device_tracks = {t for t in tracks if t[1] != 0}
    def work_track(r):   # where a rank's forwards and backwards ran: the compute stream, else the host
        return (r, 1) if (r, 1) in device_tracks else (r, 0)
    if drawing is not None or (pp is not None and micro is not None):
        if drawing is not None:
            orders = drawn_orders(drawing)
            what = "the order --print-schedule draws (%s)" % drawing
        else:
            orders = {p: ["%s%d" % (k, m + 1) for k, m in one_f_one_b(p, pp, micro)] for p in range(pp)}
            what = "1F1B exactly (P = %d, M = %d)" % (pp, micro)
        chunked = any(t[-1].isalpha() for order in orders.values() for t in order)
        wrong = []
        for rank in ranks:
            if not rank.get("profiled"):
                continue
            p, track = rank["pp"], work_track(rank["rank"])
            for it in want_steps:
                steps = [e for e in spans if (e["pid"], e["tid"]) == track and e["name"] == "step" and e["args"]["iteration"] == it]
                if len(steps) != 1:
                    wrong.append("rank %d iteration %d: %d step spans" % (rank["rank"], it, len(steps)))
                    continue
                s0, s1 = steps[0]["ts"], steps[0]["ts"] + steps[0]["dur"]
                work = sorted((e["ts"], e["name"][0].upper(), e["args"]["micro_batch"], e["args"]["chunk"]) for e in spans
                              if (e["pid"], e["tid"]) == track and e["name"] in ("forward", "backward") and
                              s0 - EPS <= e["ts"] <= s1 + EPS)
                got = ["%s%d%s" % (k, m + 1, chr(ord("a") + c) if chunked else "") for _, k, m, c in work]
                if got != orders.get(p):
                    wrong.append("rank %d (stage %d) iteration %d: %s" % (rank["rank"], p, it, " ".join(got)))
        report(not wrong and orders, label + "every stage's forwards and backwards follow %s; stage 0: %s" %
               (what, " ".join(orders.get(0, []))), "; ".join(wrong[:3]) or "nothing drawn")
    if device:
        missing = [r for r in profiled if (r, 1) not in device_tracks or (r, 2) not in device_tracks]
        report(profiled and not missing, label + "every profiled rank has device spans on the compute stream and on the "
               "communication stream", "ranks without both: %s" % missing)
        host_names = {(e["pid"], e["name"], e["args"]["iteration"]) for e in spans if e["tid"] == 0}
        orphans = [e for e in spans if e["tid"] != 0 and (e["pid"], e["name"], e["args"]["iteration"]) not in host_names]
        report(not orphans and any(e["tid"] != 0 for e in spans), label + "each device span has a host (launch) span beside "
               "it (%d device spans)" % sum(e["tid"] != 0 for e in spans), json.dumps(orphans[:1]))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

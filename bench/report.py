#!/usr/bin/env python3
"""report.py — the tables `make bench` prints (bench/bench.sh runs it last).

    python3 bench/report.py OUT [BASE_OUT]

OUT holds one build's scenario reports (max, readmix, half, soldout,
soldout-unkeyed, drain: <name>.json, .cmd and, when bench.sh left flags out,
.dropped; memory.json, ceilings.json, proxy.txt when present). BASE_OUT, when
given, holds the same for the BASE build (make bench BASE=<ref>): every figure
is then printed beside BASE's with the ratio new/base. The aims are ratios
(issue 23), printed as met / not met: those within one run for each build,
those against BASE only when there is one.

Writes OUT/bench.json and OUT/bench.md and prints the tables. Labels of the
two builds come from $BENCH_NEW_LABEL and $BENCH_BASE_LABEL.
"""
import json
import os
import re
import sys

# The system's processes (the load generator is not one of them); "box" is
# the whole machine.
SYSTEM = ["proxy", "backend", "worker", "redis-server", "mariadbd", "beam.smp"]
PROCS = SYSTEM + ["box"]
SCENARIOS = [
    ("max", "purchase, max rate (closed loop through a proxy)", "us_per_accepted_order", "accepted order"),
    ("readmix", "purchase, max rate, with the read mix (a long-poll per 202)", "us_per_accepted_order", "accepted order"),
    ("half", "purchase, open loop at half of max", "us_per_accepted_order", "accepted order"),
    ("drain", "drain of a deep queue", "us_per_accepted_order", "accepted order"),
    ("soldout", "sold-out tail, keyed purchases (new keys answered by the proxy, 10% replays by the backend)", "us_per_answer", "answer"),
    ("soldout-unkeyed", "sold-out tail, unkeyed purchases (answered by the proxy)", "us_per_answer", "answer"),
]


def load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def read_text(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


class Build:
    """One build's reports in one directory."""

    def __init__(self, out, label):
        self.out, self.label = out, label
        self.runs = {name: load_json(os.path.join(out, name + ".json")) or {} for name, _, _, _ in SCENARIOS}
        self.memory = load_json(os.path.join(out, "memory.json")) or {}
        self.ceilings = load_json(os.path.join(out, "ceilings.json")) or []
        self.dropped, self.retried = {}, {}
        for name, _, _, _ in SCENARIOS:
            d = read_text(os.path.join(out, name + ".dropped"))
            if d:
                self.dropped[name] = d.split()
            r = read_text(os.path.join(out, name + ".retried"))
            if r:
                self.retried[name] = r

    def summary(self, name, key):
        return (self.runs[name].get("summary") or {}).get(key)

    def tail_answers(self, name):
        """Answers/s of the sold-out tail, whatever they were (the keyed
        tail's replays get their order, 202); a report without phases gives
        its sold-out answers/s."""
        for p in self.runs[name].get("phases") or []:
            if p.get("name") == "tail":
                return p.get("requests_per_second")
        return self.summary(name, "sold_out_per_second_tail")

    def lat(self, name, outcome, key):
        for l in self.runs[name].get("latency") or []:
            if l.get("outcome") == outcome:
                return l.get(key)
        return None

    def procs(self, name):
        c = self.runs[name].get("cpu") or {}
        return {x["name"]: x for x in c.get("processes") or [] if not x.get("error")}

    def cpu(self, name, proc, per):
        x = self.procs(name).get(proc)
        return None if x is None else x.get(per)

    def system_cpu(self, name, per):
        """CPU µs per order (or answer) of the system's processes together;
        None when one of them was not accounted."""
        by = self.procs(name)
        if any(p not in by for p in SYSTEM):
            return None
        return sum(by[p].get(per) or 0 for p in SYSTEM)

    def system_share(self, name):
        """The system's processes over the run, as a share of the box's cores."""
        c = self.runs[name].get("cpu") or {}
        by = self.procs(name)
        if not c.get("cores") or any(p not in by for p in SYSTEM):
            return None
        return sum(by[p].get("cores") or 0 for p in SYSTEM) / c["cores"]

    def verdict(self, name):
        return self.runs[name].get("verdict_line") or "(no report)"


# FIGURES: (label, getter); every figure is printed for each build, and with
# BASE the ratio new/base beside it.
FIGURES = [
    ("max rate: accepted/s (rush)", lambda b: b.summary("max", "accepted_per_second_rush")),
    ("max rate: confirmed/s incl. drain", lambda b: b.summary("max", "confirmed_per_second_end_to_end")),
    ("max rate: p50 of 202 (ms)", lambda b: b.lat("max", "202", "p50_ms")),
    ("max rate: p99 of 202 (ms)", lambda b: b.lat("max", "202", "p99_ms")),
    ("max rate: box CPU µs per accepted order", lambda b: b.cpu("max", "box", "us_per_accepted_order")),
    ("max rate: system CPU µs per accepted order", lambda b: b.system_cpu("max", "us_per_accepted_order")),
    ("read mix: accepted/s (rush)", lambda b: b.summary("readmix", "accepted_per_second_rush")),
    ("read mix: box CPU µs per accepted order", lambda b: b.cpu("readmix", "box", "us_per_accepted_order")),
    ("half rate: requests/s sent (half of max)", lambda b: (b.runs["half"].get("run") or {}).get("rate")),
    ("half rate: p50 of 202 (ms)", lambda b: b.lat("half", "202", "p50_ms")),
    ("half rate: p99 of 202 (ms)", lambda b: b.lat("half", "202", "p99_ms")),
    ("half rate: p99.9 of 202 (ms)", lambda b: b.lat("half", "202", "p99_9_ms")),
    ("half rate: system CPU µs per accepted order", lambda b: b.system_cpu("half", "us_per_accepted_order")),
    ("half rate: system processes, share of the cores", lambda b: b.system_share("half")),
    ("drain: orders/s", lambda b: (b.runs["drain"].get("drain") or {}).get("orders_per_second")),
    ("sold-out tail, keyed: answers/s", lambda b: b.tail_answers("soldout")),
    ("sold-out tail, keyed: p99 (ms)", lambda b: b.lat("soldout", "409 sold_out", "p99_ms")),
    ("sold-out tail, unkeyed: answers/s", lambda b: b.tail_answers("soldout-unkeyed")),
    ("sold-out tail, unkeyed: p99 (ms)", lambda b: b.lat("soldout-unkeyed", "409 sold_out", "p99_ms")),
    ("Redis used_memory B/order, live sale", lambda b: b.memory.get("used_memory_per_order_live")),
    ("Redis used_memory B/order, archived", lambda b: b.memory.get("used_memory_per_order_archived")),
]


def div(a, b):
    if a is None or b is None or b == 0:
        return None
    return a / b


def fig(b, label):
    for l, get in FIGURES:
        if l == label:
            return get(b)
    raise KeyError(label)


# AIMS (issue 23): (text, value of one build, test, with_base). A within-run
# aim takes one build; a BASE aim takes (new, base) and is evaluated only with
# a BASE.
WITHIN = [
    ("half-rate system CPU per order ≤ 1.25× max-rate", "≤ 1.25×",
     lambda b: div(fig(b, "half rate: system CPU µs per accepted order"), fig(b, "max rate: system CPU µs per accepted order")),
     lambda v: v <= 1.25, "x"),
    ("half-rate system processes ≤ 60% of the box's cores", "≤ 60%",
     lambda b: fig(b, "half rate: system processes, share of the cores"),
     lambda v: v <= 0.60, "%"),
    ("half-rate p99 of 202 ≤ 4× its p50", "≤ 4×",
     lambda b: div(fig(b, "half rate: p99 of 202 (ms)"), fig(b, "half rate: p50 of 202 (ms)")),
     lambda v: v <= 4, "x"),
    ("keyed sold-out tail ≥ 0.8× unkeyed", "≥ 0.8×",
     lambda b: div(fig(b, "sold-out tail, keyed: answers/s"), fig(b, "sold-out tail, unkeyed: answers/s")),
     lambda v: v >= 0.8, "x"),
]
AGAINST = [
    # (text, aim, figure, test on new/base)
    ("max-rate accepted/s ≥ 0.95× BASE", "new/base ≥ 0.95", "max rate: accepted/s (rush)", lambda r: r >= 0.95),
    # "No worse than BASE (ratio to BASE ≥ 0.95)" for a cost: base/new ≥ 0.95.
    ("max-rate box CPU per order: BASE/new ≥ 0.95", "new/base ≤ 1.053", "max rate: box CPU µs per accepted order", lambda r: r <= 1 / 0.95),
    ("half-rate p50 of 202 no worse than BASE", "new/base ≤ 1", "half rate: p50 of 202 (ms)", lambda r: r <= 1),
    ("half-rate p99 of 202 no worse than BASE", "new/base ≤ 1", "half rate: p99 of 202 (ms)", lambda r: r <= 1),
]


def met(ok):
    return "met" if ok else "not met"


def aims(new, base):
    """The aims as rows: text, aim, new's value, base's value, verdict."""
    rows = []
    for text, aim, get, test, unit in WITHIN:
        v = get(new)
        bv = get(base) if base else None
        rows.append({"aim": text, "target": aim, "new": fmt_unit(v, unit), "base": fmt_unit(bv, unit) if base else "",
                     "value": v, "met": None if v is None else test(v),
                     "verdict": "no figure" if v is None else met(test(v))})
    for text, aim, label, test in AGAINST:
        if base is None:
            rows.append({"aim": text, "target": aim, "new": "–", "base": "", "value": None, "met": None,
                         "verdict": "needs BASE (make bench BASE=<ref>)"})
            continue
        r = div(fig(new, label), fig(base, label))
        rows.append({"aim": text, "target": aim, "new": fmt(fig(new, label)), "base": fmt(fig(base, label)),
                     "value": r, "met": None if r is None else test(r),
                     "verdict": "no figure" if r is None else "%s (%s)" % (met(test(r)), fmt_ratio(r))})
    return rows


def fmt(v):
    if v is None:
        return "–"
    v = float(v)
    if abs(v) >= 100:
        return "%.0f" % v
    if abs(v) >= 10:
        return "%.1f" % v
    return "%.2f" % v


# Figures that are shares (printed as percent).
SHARES = {"half rate: system processes, share of the cores"}


def fmt_fig(label, v):
    return fmt_unit(v, "%") if label in SHARES else fmt(v)


def fmt_ratio(r):
    return "–" if r is None else "%.2f×" % r


def fmt_unit(v, unit):
    if v is None:
        return "–"
    return "%.0f%%" % (100 * v) if unit == "%" else fmt_ratio(v)


def figures(new, base):
    rows = []
    for label, get in FIGURES:
        v = get(new)
        row = {"figure": label, "new": v}
        if base is not None:
            bv = get(base)
            row["base"], row["ratio"] = bv, div(v, bv)
        rows.append(row)
    return rows


def ceiling_ratio(d, name, figure):
    for c in d.get("ceilings") or []:
        if c["name"] == name and c["figure"] == figure:
            return c["ratio"]
    return None


def forward_path(proxy):
    """The proxy's forward path from scripts/bench-proxy.sh: its req/s over
    the bare pass-through's, and each one's CPU per request (rows: target
    req/s p50 p99 non-2xx cpu redis-cpu sum cmds/req ratios)."""
    m = re.search(r"^passthrough\s+([\d.]+)\s+\S+\s+\S+\s+\S+\s+([\d.]+)\s.*\s[\d.]+x direct$", proxy, re.M)
    n = re.search(r"^proxy\s+([\d.]+)\s+\S+\s+\S+\s+\S+\s+([\d.]+)\s+(\S+)\s.*\s([\d.]+)x passthrough$", proxy, re.M)
    if not (m and n):
        return None
    return {"passthrough_rps": float(m.group(1)), "passthrough_us": float(m.group(2)),
            "proxy_rps": float(n.group(1)), "proxy_us": float(n.group(2)), "ratio": float(n.group(4)),
            "redis_us": float(n.group(3)) if re.fullmatch(r"[\d.]+", n.group(3)) else None}


def table(header, rows, aligns=None):
    """Plain-text columns."""
    cells = [header] + rows
    w = [max(len(str(r[i])) for r in cells) for i in range(len(header))]
    aligns = aligns or ["<"] + [">"] * (len(header) - 1)
    return ["  ".join(("%-*s" if a == "<" else "%*s") % (w[i], str(r[i])) for i, a in enumerate(aligns)).rstrip() for r in cells]


def md_table(header, rows):
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + \
        ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]


def main(argv):
    if len(argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 2
    out = argv[1]
    new = Build(out, os.environ.get("BENCH_NEW_LABEL") or "new")
    base = Build(argv[2], os.environ.get("BENCH_BASE_LABEL") or "base") if len(argv) == 3 else None
    proxy = read_text(os.path.join(out, "proxy.txt"))
    fwd = forward_path(proxy)
    load_line = ""
    lm = re.search(r"load average ([\d. ]+) before, ([\d. ]+) after", proxy)
    if lm:
        load_line = "%s → %s" % (lm.group(1).split()[0], lm.group(2).split()[0])

    figs = figures(new, base)
    aim_rows = aims(new, base)
    builds = [("new", new)] + ([("base", base)] if base else [])

    # CPU µs per order (per answer for the sold-out tail) by process, per
    # scenario: each build's row and, with BASE, new/base.
    cpu_rows = []
    for name, title, per, unit in SCENARIOS:
        vals = {}
        for tag, b in builds:
            vals[tag] = {p: b.cpu(name, p, per) for p in PROCS}
            vals[tag]["system"] = b.system_cpu(name, per)
            c = b.runs[name].get("cpu") or {}
            vals[tag]["load"] = "%.2f → %.2f" % (c["load_average_start"][0], c["load_average_end"][0]) if c.get("load_average_start") else ""
        cpu_rows.append((name, title, unit, vals))

    notes = []
    for tag, b in builds:
        for name, flags in sorted(b.dropped.items()):
            notes.append("%s (%s): left out %s: the bench of %s lacks %s" % (
                name, tag, " ".join(flags), b.label, "it" if len(flags) == 1 else "them"))
        for name, why in sorted(b.retried.items()):
            notes.append("%s (%s): run twice, the first could not be made: %s" % (name, tag, why))
    verdicts = []
    for tag, b in builds:
        for name, title, _, _ in SCENARIOS:
            v = b.verdict(name)
            if not v.startswith("verdict: ok"):
                verdicts.append("%s (%s): %s" % (name, tag, v))

    # Text.
    lines = []
    if base:
        lines.append("new: %s; base: %s" % (new.label, base.label))
        lines.append("")
        lines += table(["figure", "new", "base", "new/base"],
                       [(r["figure"], fmt_fig(r["figure"], r["new"]), fmt_fig(r["figure"], r["base"]), fmt_ratio(r["ratio"])) for r in figs])
    else:
        lines.append("build: %s (no BASE: make bench BASE=<ref> adds a base column and the ratios)" % new.label)
        lines.append("")
        lines += table(["figure", "value"], [(r["figure"], fmt_fig(r["figure"], r["new"])) for r in figs])
    lines.append("")
    hdr = ["CPU µs per order", "build"] + PROCS + ["system", "per", "load (1 min)"]
    rows = []
    for name, title, unit, vals in cpu_rows:
        for tag, _ in builds:
            v = vals[tag]
            rows.append([name, tag] + [fmt(v[p]) for p in PROCS] + [fmt(v["system"]), unit, v["load"]])
        if base:
            rows.append([name, "new/base"] + [fmt_ratio(div(vals["new"][p], vals["base"][p])) for p in PROCS + ["system"]] + [unit, ""])
    lines += table(hdr, rows, ["<", "<"] + [">"] * (len(PROCS) + 1) + ["<", "<"])
    if fwd:
        lines.append("forward path (make bench-proxy, this build only): proxy %.2f× the bare pass-through (%.0f vs %.0f req/s), CPU per request %.1f vs %.1f µs" % (
            fwd["ratio"], fwd["proxy_rps"], fwd["passthrough_rps"], fwd["proxy_us"], fwd["passthrough_us"]))
    lines.append("")
    if base:
        lines += table(["aim (issue 23)", "target", "new", "base", "verdict (new)"],
                       [(a["aim"], a["target"], a["new"], a["base"], a["verdict"]) for a in aim_rows], ["<", "<", ">", ">", "<"])
    else:
        lines += table(["aim (issue 23)", "target", "value", "verdict"],
                       [(a["aim"], a["target"], a["new"], a["verdict"]) for a in aim_rows], ["<", "<", ">", "<"])
    if any(b.ceilings for _, b in builds):
        lines.append("")
    for tag, b in builds:
        if b.ceilings:
            lines.append("raw ceilings (%s): " % tag + "; ".join("%s %.0f %s" % (c["name"], c["per_second"], c["unit"]) for c in b.ceilings))
    if notes:
        lines += [""] + ["note: " + n for n in notes]
    if verdicts:
        lines += [""] + verdicts
    if proxy:
        lines += ["", "proxy forward path (scripts/bench-proxy.sh, this build):", proxy]
    lines += ["", "saved: %s/bench.json, %s/bench.md" % (out, out)]
    text = "\n".join(lines) + "\n"

    # Markdown.
    md = ["# seckill bench", ""]
    if base:
        md += ["new: %s; base: %s. Ratios are new/base, both from this run (the builds ran alternately on the same services)." % (new.label, base.label), ""]
        md += md_table(["figure", "new", "base", "new/base"],
                       [(r["figure"], fmt_fig(r["figure"], r["new"]), fmt_fig(r["figure"], r["base"]), fmt_ratio(r["ratio"])) for r in figs])
    else:
        md += ["build: %s (no BASE)." % new.label, ""]
        md += md_table(["figure", "value"], [(r["figure"], fmt_fig(r["figure"], r["new"])) for r in figs])
    md += ["", "## Aims (issue 23: ratios)", ""]
    md += md_table(["aim", "target", "new", "base", "verdict (new)"],
                   [(a["aim"], a["target"], a["new"], a["base"] or "–", a["verdict"]) for a in aim_rows])
    md += ["", "## CPU µs per order, by process", ""]
    md += md_table(hdr, rows)
    md += ["", "## Ratios to the raw ceilings of the run", ""]
    crow = []
    for tag, b in builds:
        mx, rm, dr = b.runs["max"], b.runs["readmix"], b.runs["drain"]
        crow.append(("max (%s)" % tag, "%.3f× reserve, %.3f× publish; confirmed %.3f× transaction" % tuple(
            x or 0 for x in (ceiling_ratio(mx, "reserve", "accepted/s (rush)"), ceiling_ratio(mx, "publish", "accepted/s (rush)"),
                             ceiling_ratio(mx, "transaction", "confirmed/s (end to end)")))))
        crow.append(("readmix (%s)" % tag, "%.3f× reserve, %.3f× publish" % tuple(
            x or 0 for x in (ceiling_ratio(rm, "reserve", "accepted/s (rush)"), ceiling_ratio(rm, "publish", "accepted/s (rush)")))))
        crow.append(("drain (%s)" % tag, "%.3f× transaction" % (ceiling_ratio(dr, "transaction", "drain orders/s") or 0)))
    md += md_table(["scenario", "ratio"], crow)
    for tag, b in builds:
        if b.ceilings:
            md += ["", "Raw ceilings (%s; bin/bench ceilings, same run, same services): " % tag +
                   "; ".join("%s %.0f %s (%s)" % (c["name"], c["per_second"], c["unit"], c.get("detail", "")) for c in b.ceilings) + "."]
    md += ["", "## Commands", "", "Inside `make bench`, after `bench/stack.sh` started 2 workers, a backend and a proxy for each build:", ""]
    for tag, b in builds:
        for name, title, _, _ in SCENARIOS:
            c = read_text(os.path.join(b.out, name + ".cmd"))
            if c:
                md.append("* %s (%s): `%s`" % (title, tag, c))
    if notes:
        md += ["", "## Flags left out, runs made twice", ""] + ["* " + n for n in notes]
    md += ["", "## Verdicts", ""]
    for tag, b in builds:
        for name, title, _, _ in SCENARIOS:
            md.append("* %s (%s): `%s`" % (name, tag, b.verdict(name)))
    if proxy:
        md += ["", "## Proxy forward path (scripts/bench-proxy.sh, this build only)", "", "```", proxy, "```"]
    md += ["", "CPU: user + system time per process from /proc, from the rush's start until the queue was drained; system is proxy + backend + workers + redis-server + mariadbd + beam.smp (not the load generator); box is the whole machine (other processes on it included, the idle stack of the other build too). The services' CPU includes whatever else used them meanwhile.",
           "", "Per-scenario reports: <scenario>.html (and .json, .txt, .cmd) beside this file" + ("; BASE's under base/." if base else ".")]

    summary = {
        "new": new.label, "base": base.label if base else None,
        "figures": figs,
        "aims": [{k: v for k, v in a.items()} for a in aim_rows],
        "cpu_us": [{"scenario": name, "per": unit, "builds": vals} for name, _, unit, vals in cpu_rows],
        "notes": notes,
        "ceilings": {tag: b.ceilings for tag, b in builds},
        "memory": {tag: b.memory for tag, b in builds},
        "proxy_forward_path": proxy, "forward_path": fwd, "forward_path_load": load_line,
    }
    with open(os.path.join(out, "bench.json"), "w") as f:
        json.dump(summary, f, indent=2)
    with open(os.path.join(out, "bench.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

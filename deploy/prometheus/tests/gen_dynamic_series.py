#!/usr/bin/env python3
"""Prints the input_series block of dynamic_test.yml.

The traffic it describes is explained at the top of dynamic_test.yml. To
change it, edit this script and paste its output over the input_series
block: python3 gen_dynamic_series.py
"""
STEP = 300  # 5m
DAYS = 8
N = DAYS * 86400 // STEP  # samples after the first

def compress(vals):
    """Run-length encode a list of numbers in promtool's a+bxn notation."""
    out, i = [], 0
    while i < len(vals):
        j = i + 1
        if j < len(vals):
            d = vals[j] - vals[i]
            while j + 1 < len(vals) and vals[j + 1] - vals[j] == d:
                j += 1
            out.append(f"{fmt(vals[i])}+{fmt(d)}x{j - i}")
            i = j + 1
        else:
            out.append(fmt(vals[i])); i = j
    return " ".join(out)

def fmt(x):
    return str(int(x)) if float(x).is_integer() else repr(x)

def counter(rate_at):
    """Cumulative count when rate_at(t) req/s holds over each step before t."""
    vals, c = [0], 0
    for k in range(1, N + 1):
        t = (k - 1) * STEP
        c += round(rate_at(t) * STEP)
        vals.append(c)
    return vals

def day(t): return t // 86400
def daytime(t): return (t % 86400) >= 43200  # the second half of each day

# Day-to-day variation of the past 7 days, then today (day 7).
factor = [1.0, 1.1, 0.9, 1.05, 0.95, 1.0, 1.0, 1.02]

def chat(t):   # 1 req/s at night, 10 by day, every day
    return (10 if daytime(t) else 1) * factor[day(t)]
def search(t): # 0.5 at night, 4 by day; today's daytime falls to 1
    if day(t) == 7 and daytime(t): return 1
    return (4 if daytime(t) else 0.5) * factor[day(t)]
def code(t):   # 1 at night, 2 by day, no variation
    return 2 if daytime(t) else 1

# code's TTFT: night in (0, 0.5], day in (0.5, 1], today's day in (1, 2].
def code_bucket(le):
    def r(t):
        n = code(t)
        if not daytime(t): lo = 0.5
        elif day(t) == 7: lo = 2
        else: lo = 1
        return n if le >= lo else 0
    return r

base = 'route="chat_completions",model="m",team="t",env="prod"'
print("    input_series:")
for scene, f in [("chat", chat), ("search", search), ("code", code)]:
    print(f"      - series: 'tollgate_requests_total{{{base},scene=\"{scene}\",code=\"200\",outcome=\"ok\"}}'")
    print(f"        values: '{compress(counter(f))}'")
for le, lev in [("0.5", 0.5), ("1", 1), ("2", 2), ("3", 3), ("+Inf", float('inf'))]:
    print(f"      - series: 'tollgate_time_to_first_token_seconds_bucket{{{base},scene=\"code\",input_bucket=\"0-500\",le=\"{le}\"}}'")
    print(f"        values: '{compress(counter(code_bucket(lev)))}'")

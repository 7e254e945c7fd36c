#!/usr/bin/env bash
# strata plot, read back: the SVG parses as XML and holds a title, both axis labels, 1-2-5 ticks that
# span the data, one polyline point per finite training loss, the evaluation curve when the metrics have
# eval_loss, decade ticks with --log-y; bad input (a bad line, /dev/zero, a missing file) is an error
# naming the file (and line).
#   plot_cli.sh STRATA
set -uo pipefail
strata=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 - "$work" <<'PY'
import json, math, sys
w = sys.argv[1]
with open(f"{w}/m.jsonl", "w") as f:
    for s in range(1, 301):
        line = {"step": s, "loss": 5.5 * math.exp(-s / 60) + 0.2}
        if s == 150: line["loss"] = None  # a skipped step: no point
        if s % 50 == 0: line["eval_loss"] = line["loss"] + 0.1 if line["loss"] else 1.0
        f.write(json.dumps(line) + "\n")
with open(f"{w}/bad.jsonl", "w") as f:
    f.write('{"step": 1, "loss": 2}\n{"step": 2}\n')
PY
fails=0 runs=0
check() { runs=$((runs + 1)); [ "$2" -eq 0 ] || { echo "FAIL: $1: $3"; fails=$((fails + 1)); }; }

out=$("$strata" plot "$work/m.jsonl" -o "$work/loss.svg" 2>&1)
check "plot writes the SVG" $? "$out"
out=$("$strata" plot "$work/m.jsonl" -o "$work/log.svg" --log-y --title "demo <run>" 2>&1)
check "plot --log-y writes the SVG" $? "$out"
out=$(python3 - "$work" <<'PY'
import sys, xml.etree.ElementTree as ET
w = sys.argv[1]
ns = {"s": "http://www.w3.org/2000/svg"}
def load(name):
    root = ET.parse(f"{w}/{name}").getroot()
    texts = {}
    for t in root.iter("{http://www.w3.org/2000/svg}text"):
        texts.setdefault(t.get("class"), []).append(t.text)
    lines = {p.get("class"): p.get("points").split() for p in root.iter("{http://www.w3.org/2000/svg}polyline")}
    return root, texts, lines
def nice(v):  # 1, 2 or 5 times a power of ten
    m = f"{abs(v):.6e}".split("e")[0].rstrip("0").rstrip(".")
    return m in ("1", "2", "5")
root, texts, lines = load("loss.svg")
assert texts["title"] == ["loss: m.jsonl"], texts["title"]
assert texts["xlabel"] == ["step"] and texts["ylabel"] == ["loss"], (texts["xlabel"], texts["ylabel"])
assert len(lines["train"]) == 299, len(lines["train"])  # 300 steps, one skipped
assert len(lines["eval"]) == 6, len(lines["eval"])
for axis, lo, hi in (("xtick", 1, 300), ("ytick", 0.2, 5.5 * 2.718 ** (-1 / 60) + 0.3)):
    v = [float(t) for t in texts[axis]]
    d = [round(b - a, 9) for a, b in zip(v, v[1:])]
    assert len(set(d)) == 1 and nice(d[0]), (axis, v)  # evenly spaced by a 1-2-5 step
    assert v[0] <= lo and v[-1] >= hi and 4 <= len(v) <= 12, (axis, v, lo, hi)
root, texts, lines = load("log.svg")
assert texts["title"] == ["demo <run>"] and texts["ylabel"] == ["loss (log scale)"], texts
v = [float(t) for t in texts["ytick"]]
assert all(nice(x) for x in v) and v[0] <= 0.2 and v[-1] >= 5.4 and v == sorted(v), v
assert {0.2, 0.5, 1, 2, 5} <= set(v), v
print("ok")
PY
)
check "the SVG read back: $out" $? "$out"
out=$("$strata" plot "$work/bad.jsonl" -o "$work/bad.svg" 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q "bad.jsonl:2: not a metrics line" <<<"$out"
check "a line without a loss is named" $? "$rc $out"
# /dev/zero grew one endless "line" until bad_alloc (exit 134); a missing file is named.
out=$(timeout 60 "$strata" plot /dev/zero -o "$work/zero.svg" 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q "metrics file '/dev/zero' is not a regular file" <<<"$out"
check "/dev/zero as the metrics file is refused" $? "$rc $out"
out=$("$strata" plot "$work/none.jsonl" -o "$work/none.svg" 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q "cannot open metrics file '$work/none.jsonl'" <<<"$out"
check "a missing metrics file is named" $? "$rc $out"
out=$("$strata" plot "$work/m.jsonl" -o "$work/loss.png" 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q "must end in .svg" <<<"$out"
check "a .png output is refused with the reason" $? "$rc $out"
echo "$((runs - fails)) passed, $fails failed"
[ "$fails" -eq 0 ]

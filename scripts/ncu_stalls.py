#!/usr/bin/env python3
"""Where a kernel's warps wait, from Nsight Compute's source page exported as CSV
(ncu -i REPORT --page source --csv --print-source sass): the stall reasons over all warp
samples, the producer warpgroup's share of them (its code runs from the register deallocation
to the next unconditional EXIT), the mbarrier wait loops (a try_wait and the branch that
retries it, summed over every branch to the same loop) and the hottest instructions.

    scripts/ncu_stalls.py SOURCE.csv [TOP]
"""
import collections
import csv
import signal
import sys

SAMPLES = 'Warp Stall Sampling (All Samples)'


def main(path, top):
    rows = list(csv.reader(open(path, newline='')))
    header = next((i for i, r in enumerate(rows) if 'Source' in r and SAMPLES in r), None)
    if header is None:
        sys.exit(f'{path}: no source page with "{SAMPLES}" (ncu --page source --csv)')
    col = {name: i for i, name in enumerate(rows[header])}
    body = [r for r in rows[header + 1:] if len(r) == len(rows[header])]
    reasons = [n for n in col if n.startswith('stall_') and 'Not Issued' not in n]
    count = lambda r, name: int(r[col[name]] or 0)
    total = sum(count(r, SAMPLES) for r in body) or 1
    kernel = rows[0][1] if rows and len(rows[0]) > 1 else path
    print(f'{kernel[:120]}\n{total} warp samples over {len(body)} instructions')

    by_reason = collections.Counter()
    for r in body:
        by_reason.update({n[6:]: count(r, n) for n in reasons})
    print('stall reasons: ' + ', '.join(f'{n} {100 * v / total:.1f}%'
                                         for n, v in by_reason.most_common(8) if v))

    sources = [r[col['Source']].strip() for r in body]
    start = next((i for i, x in enumerate(sources) if 'USETMAXREG.DEALLOC' in x), None)
    if start is not None:
        end = next((i for i in range(start, len(body)) if sources[i].startswith('EXIT')),
                   len(body) - 1)
        producer = body[start:end + 1]
        mine = sum(count(r, SAMPLES) for r in producer)
        why = collections.Counter()
        for r in producer:
            why.update({n[6:]: count(r, n) for n in reasons})
        print(f'producer ({end + 1 - start} instructions from {start}): '
              f'{100 * mine / total:.1f}% of samples; '
              + ', '.join(f'{n} {100 * v / (mine or 1):.0f}%' for n, v in why.most_common(6) if v))

    # A wait loop: SYNCS.PHASECHK ... TRYWAIT then "@!P BRA target"; the out-of-line retry
    # copy branches to the same target, so sum the branches by target.
    loops = collections.defaultdict(lambda: [0, None])
    for i, r in enumerate(body[:-1]):
        source = r[col['Source']].strip()
        if 'TRYWAIT' in source and 'BRA' in body[i + 1][col['Source']]:
            target = body[i + 1][col['Source']].split()[-1]
            loops[target][1] = loops[target][1] or (i, source)
    for r in body:
        source = r[col['Source']].strip()
        if 'BRA' in source and source.split()[-1] in loops:
            loops[source.split()[-1]][0] += count(r, SAMPLES)
    print('mbarrier waits (index of the try_wait, share of all samples):')
    for target, (samples, first) in sorted(loops.items(), key=lambda kv: -kv[1][0])[:8]:
        if first and samples:
            print(f'  {first[0]:5d} {100 * samples / total:5.1f}%  {first[1][:90]}')

    print(f'hottest {top} instructions (index, share, reasons):')
    hot = sorted(range(len(body)), key=lambda i: -count(body[i], SAMPLES))[:top]
    for i in hot:
        r = body[i]
        why = sorted(((count(r, n), n[6:]) for n in reasons), reverse=True)[:3]
        print(f'  {i:5d} {100 * count(r, SAMPLES) / total:5.1f}%  '
              f'{r[col["Source"]].strip()[:60]:60s} ' + ', '.join(f'{n} {v}' for v, n in why if v))


if __name__ == '__main__':
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # piped into head: stop quietly
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 12)

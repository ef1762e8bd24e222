#!/usr/bin/env python3
"""Replay the mutants cargo-mutants missed against the tree as it is now and
a chosen set of tests, to see which are caught since (see TESTING.md).

usage: python3 .ci/replay_mutants.py OUTDIR FILE -- <cargo test arguments>

OUTDIR is the directory given to `cargo mutants -o`; FILE the source file the
mutants are in. Each missed mutant's diff is applied with `patch`, the tests
run, and the file restored with `git checkout`, so FILE must be committed.
Regression files proptest writes for a mutant are removed again.
"""
import json
import os
import subprocess
import sys


def main():
    if '--' not in sys.argv or len(sys.argv) < 4:
        sys.exit(__doc__)
    outdir, path = sys.argv[1], sys.argv[2]
    args = sys.argv[sys.argv.index('--') + 1:]
    if subprocess.run(['git', 'diff', '--quiet', '--', path]).returncode != 0:
        sys.exit(f'{path} has uncommitted changes: commit them first')
    with open(os.path.join(outdir, 'mutants.out', 'outcomes.json')) as f:
        outcomes = json.load(f)['outcomes']
    for o in outcomes:
        if o.get('summary') != 'MissedMutant':
            continue
        name = o['scenario']['Mutant']['name']
        diff = os.path.join(outdir, 'mutants.out', o['diff_path'])
        p = subprocess.run(['patch', '-s', '-f', path, diff], capture_output=True, text=True)
        if p.returncode != 0:
            verdict, failed = 'NOPATCH ', []
        else:
            try:
                t = subprocess.run(['cargo', 'test', *args], capture_output=True, text=True,
                                   timeout=600)
                out = t.stdout + t.stderr
                if 'could not compile' in out and 'test result' not in out:
                    verdict = 'UNVIABLE'
                else:
                    verdict = 'caught  ' if t.returncode != 0 else 'MISSED  '
                failed = [line.split()[1] for line in out.splitlines()
                          if line.startswith('test ') and line.endswith('FAILED')]
            except subprocess.TimeoutExpired:
                verdict, failed = 'timeout ', []
        subprocess.run(['git', 'checkout', '--', path])
        for leftover in (path + '.orig', path + '.rej'):
            if os.path.exists(leftover):
                os.remove(leftover)
        # A failing property saves its case; this one belongs to the mutant.
        subprocess.run(['git', 'checkout', '--', '*.proptest-regressions'],
                       capture_output=True)
        subprocess.run(['git', 'clean', '-qf', '--', '*.proptest-regressions'])
        print(f'{verdict} {name}  {" ".join(failed[:3])}', flush=True)


if __name__ == '__main__':
    main()

import json, os, sys
O = 'docs/results/data'
keys = ['passkey','multikey','multivalue','vartrack','longgen','all','agreement_forced','agreement_free','kl','attention_recall']
def load(w, s):
    f = f'{O}/eval-spec-weights-{w}-seed{s}-4k.json'
    if not os.path.exists(f) or not os.path.getsize(f): return None
    return {r['config']: r for r in json.load(open(f))['summary']}
ws = ['q8_0', 'q6_k', 'q5_k', 'q4_k']
seeds = [1, 7, 11, 13]
print('| config | seeds | ' + ' | '.join(keys) + ' |')
print('|---|---|' + '---:|' * len(keys))
for w in ws:
    have = [s for s in seeds if load(w, s)]
    if not have: continue
    for c in ['dense', 'spec@6%']:
        if c == 'dense' and w != 'q8_0': continue
        acc = {k: 0.0 for k in keys}
        for s in have:
            r = load(w, s)[c]
            for k in keys:
                if k in r: acc[k] += r[k] / len(have)
        lab = 'dense' if c == 'dense' else f'spec@6%, weights {w}'
        print(f'| {lab} | {",".join(map(str, have))} | ' + ' | '.join('%.3f' % acc[k] if (c != 'dense' or k not in keys[6:]) else '-' for k in keys) + ' |')
# paired: each type against q8_0 on the seeds both have
for w in ws[1:]:
    both = [s for s in seeds if load(w, s) and load('q8_0', s)]
    if not both: continue
    d = {k: sum(load(w, s)['spec@6%'][k] - load('q8_0', s)['spec@6%'][k] for s in both) / len(both) for k in keys}
    print(f'paired {w} - q8_0 on seeds {both}: ' + ', '.join('%s %+.3f' % (k, d[k]) for k in keys))

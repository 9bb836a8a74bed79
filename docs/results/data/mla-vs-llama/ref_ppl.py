"""The float64 reference's perplexity in llama-perplexity's chunking (128, 8
chunks, first token BOS, second half scored), the text tokenized by kvsieve:
    ref_ppl.py MODEL.gguf TEXT   (from the repository root, build/kvsieve built)"""
import os, sys, json, math, subprocess, torch
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import reference as R
model, text = sys.argv[1], open(sys.argv[2]).read()
out = subprocess.run([os.path.join(ROOT, "build", "kvsieve"), "tokenize", "-m", model, "-p", text, "--json"], capture_output=True, text=True).stdout
ids = json.loads(out)
if isinstance(ids, dict): ids = ids.get("ids") or ids.get("tokens")
ids = [1] + [int(x) for x in ids]
m = R.Model(model, n_ctx=4096)
pc, nll, cnt = 128, 0.0, 0
for ch in range(8):
    b = ids[ch * pc:(ch + 1) * pc]; b[0] = 1
    lg = m.forward(b)
    lp = torch.log_softmax(lg, dim=-1)
    for j in range(pc // 2, pc - 1):
        nll -= float(lp[j, ids[ch * pc + j + 1]]); cnt += 1
    print(ch, math.exp(nll / cnt), flush=True)
print("reference PPL", math.exp(nll / cnt), cnt)
